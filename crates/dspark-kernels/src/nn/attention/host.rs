//! The single-pass CPU entries of the attention fronts: each reads contiguous f32 inputs from
//! storage and runs the panel kernels of [`super::kernel`], or returns `None` (not contiguous
//! f32 CPU tensors of the expected shapes, or the tensor path forced) so the front runs its
//! candle chain.

use candle_core::Tensor;

use super::kernel::{self as attention, HeadKv, HeadView};
use crate::error::Result;
use crate::nn::fused::fast_f32;
use crate::nn::packed::PANEL;

/// Non-causal grouped-query attention of `q: [Q, heads, hd]` against head-major `k`, `v:
/// [kv_heads, S, hd]`, giving `[Q, heads·hd]` (the drafter's block over its context), through
/// [`attention::grouped`].
pub(crate) fn gqa_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
) -> Option<Result<Tensor>> {
    let &[q_len, heads, hd] = q.dims() else {
        return None;
    };
    let &[kvh, s, khd] = k.dims() else {
        return None;
    };
    if v.dims() != k.dims() || khd != hd || hd == 0 || s == 0 || kvh == 0 {
        return None;
    }
    if heads == 0 || !heads.is_multiple_of(kvh) {
        return None;
    }
    let out = fast_f32(q, |qs| {
        fast_f32(k, |ks| {
            fast_f32(v, |vs| {
                let view = |data, kh: usize| HeadView::new(data, kh * s * hd, hd, s);
                let kv = |kh| HeadKv::Rows(view(ks, kh), view(vs, kh));
                attention::grouped(qs, q_len, heads, kvh, hd, kv, scale as f32, |_| s)
            })
        })
    })???;
    Some(Tensor::from_vec(out, (q_len, heads * hd), q.device()).map_err(Into::into))
}

/// Causal grouped-query attention of `q: [Q, heads, hd]` against token-major `k`, `v:
/// [S, kv_heads, hd]` (`S >= Q`; query `i` sees keys `0 ..= S − Q + i`), giving
/// `[Q, heads·hd]`, straight from storage through the panel products of
/// [`attention::grouped`] (a verification's queries share one pass over the cache).
pub(crate) fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
) -> Option<Result<Tensor>> {
    let &[q_len, heads, hd] = q.dims() else {
        return None;
    };
    let &[s, kvh, khd] = k.dims() else {
        return None;
    };
    if v.dims() != k.dims() || khd != hd || hd == 0 || s < q_len || kvh == 0 {
        return None;
    }
    if heads == 0 || !heads.is_multiple_of(kvh) {
        return None;
    }
    let (past, scale) = (s - q_len, scale as f32);
    let out = fast_f32(q, |qs| {
        fast_f32(k, |ks| {
            fast_f32(v, |vs| {
                let view = |data, kh: usize| HeadView::new(data, kh * hd, kvh * hd, s);
                let kv = |kh| HeadKv::Rows(view(ks, kh), view(vs, kh));
                attention::grouped(qs, q_len, heads, kvh, hd, kv, scale, |i| past + i + 1)
            })
        })
    })???;
    Some(Tensor::from_vec(out, (q_len, heads * hd), q.device()).map_err(Into::into))
}

/// [`causal_attention`] against a cache that keeps its keys transposed: `kt: [kv_heads, hd,
/// cap]` (key `j` of head `h` is `kt[h, :, j]`) and `v: [cap, kv_heads, hd]`, of which the first
/// `s` tokens are live (`q_len <= s <= cap`). The keys are multiplied where they lie as panels
/// of 16 keys (`cap` a multiple of 16), so a decode step packs nothing; same bits as
/// [`causal_attention`] on the same keys and values.
pub(crate) fn causal_attention_kt(
    q: &Tensor,
    kt: &Tensor,
    v: &Tensor,
    s: usize,
    scale: f64,
) -> Option<Result<Tensor>> {
    let &[q_len, heads, hd] = q.dims() else {
        return None;
    };
    let &[kvh, khd, cap] = kt.dims() else {
        return None;
    };
    if v.dims() != [cap, kvh, hd] || khd != hd || hd == 0 || kvh == 0 {
        return None;
    }
    if s < q_len || s > cap || !cap.is_multiple_of(PANEL) {
        return None;
    }
    if heads == 0 || !heads.is_multiple_of(kvh) {
        return None;
    }
    let out = fast_f32(q, |qs| {
        fast_f32(kt, |ks| {
            fast_f32(v, |vs| {
                let kv = (ks, vs);
                attention::causal_transposed(qs, q_len, heads, kvh, hd, kv, cap, s, scale as f32)
            })
        })
    })????;
    Some(Tensor::from_vec(out, (q_len, heads * hd), q.device()).map_err(Into::into))
}
