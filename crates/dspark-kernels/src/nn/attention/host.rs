//! The single-pass CPU entries of the attention fronts: each reads contiguous f32 inputs from
//! storage and runs the panel kernels of [`super::kernel`], or returns `None` (not contiguous
//! f32 CPU tensors of the expected shapes, or the tensor path forced) so the front runs its
//! candle chain.

use candle_core::Tensor;

use super::kernel::{self as attention, HeadKv, HeadView};
use crate::error::Result;
use crate::nn::fused::fast_f32;
use crate::nn::packed::PANEL;

/// `q: [Q, heads, hd]`'s `(Q, heads, hd)`, when its heads are a multiple of `kv_heads` and
/// neither count nor `hd` is zero.
fn query_dims(q: &Tensor, kv_heads: usize) -> Option<(usize, usize, usize)> {
    let &[q_len, heads, hd] = q.dims() else {
        return None;
    };
    let ok = hd > 0 && kv_heads > 0 && heads > 0 && heads.is_multiple_of(kv_heads);
    ok.then_some((q_len, heads, hd))
}

/// `f(q, k, v)` over the three tensors' f32 storage, as a `[Q, width]` tensor on `q`'s device:
/// `None` where a tensor is not contiguous f32 on the CPU, the tensor path is forced, or `f`
/// declines.
fn over_storage(
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (q_len, width): (usize, usize),
    f: impl FnOnce(&[f32], &[f32], &[f32]) -> Option<Vec<f32>>,
) -> Option<Result<Tensor>> {
    let out = fast_f32(q, |qs| fast_f32(k, |ks| fast_f32(v, |vs| f(qs, ks, vs))))????;
    Some(Tensor::from_vec(out, (q_len, width), q.device()).map_err(Into::into))
}

/// Grouped-query attention of `q: [Q, heads, hd]` giving `[Q, heads·hd]` straight from storage
/// through the panel products of [`attention::grouped`]: non-causal against head-major `k`, `v:
/// [kv_heads, S, hd]` (`S >= 1`; the drafter's block over its context), or, when `causal`,
/// against token-major `k`, `v: [S, kv_heads, hd]` (`S >= Q`; query `i` sees keys
/// `0 ..= S − Q + i`; a verification's queries share one pass over the cache).
pub(crate) fn grouped_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    causal: bool,
) -> Option<Result<Tensor>> {
    let (kvh, s, khd) = match *k.dims() {
        [s, kvh, khd] if causal => (kvh, s, khd),
        [kvh, s, khd] if !causal => (kvh, s, khd),
        _ => return None,
    };
    let (q_len, heads, hd) = query_dims(q, kvh)?;
    let enough = if causal { s >= q_len } else { s > 0 };
    if v.dims() != k.dims() || khd != hd || !enough {
        return None;
    }
    // Where key head `kh` starts and the step between its rows.
    let (head_step, row_step) = if causal { (hd, kvh * hd) } else { (s * hd, hd) };
    let past = s - q_len.min(s);
    let seen = |i: usize| if causal { past + i + 1 } else { s };
    over_storage((q, k, v), (q_len, heads * hd), |qs, ks, vs| {
        let view = |data, kh: usize| HeadView::new(data, kh * head_step, row_step, s);
        let kv = |kh| HeadKv::Rows(view(ks, kh), view(vs, kh));
        let scale = scale as f32;
        Some(attention::grouped(
            qs, q_len, heads, kvh, hd, kv, scale, seen,
        ))
    })
}

/// [`grouped_attention`] (causal) against a cache that keeps its keys transposed: `kt: [kv_heads, hd,
/// cap]` (key `j` of head `h` is `kt[h, :, j]`) and `v: [cap, kv_heads, hd]`, of which the first
/// `s` tokens are live (`q_len <= s <= cap`). The keys are multiplied where they lie as panels
/// of 16 keys (`cap` a multiple of 16), so a decode step packs nothing; same bits as
/// [`grouped_attention`] on the same keys and values.
pub(crate) fn causal_attention_kt(
    q: &Tensor,
    kt: &Tensor,
    v: &Tensor,
    s: usize,
    scale: f64,
) -> Option<Result<Tensor>> {
    let &[kvh, khd, cap] = kt.dims() else {
        return None;
    };
    let (q_len, heads, hd) = query_dims(q, kvh)?;
    if v.dims() != [cap, kvh, hd] || khd != hd {
        return None;
    }
    if s < q_len || s > cap || !cap.is_multiple_of(PANEL) {
        return None;
    }
    over_storage((q, kt, v), (q_len, heads * hd), |qs, ks, vs| {
        let kv = (ks, vs);
        attention::causal_transposed(qs, q_len, heads, kvh, hd, kv, cap, s, scale as f32)
    })
}
