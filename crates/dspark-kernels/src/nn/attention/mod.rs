//! Grouped-query attention: without a mask (the drafter's block against its fused context) and
//! causal over a KV cache (the native target), as candle-op fronts whose contiguous f32 CPU
//! inputs take the single-pass host kernels of [`kernel`] (through `host.rs`).

mod batched;
mod host;
pub mod kernel;
mod panel_kv;

pub use batched::{IotaCache, Keys, batched_attention, causal_mask, padding_mask};
pub use panel_kv::{Buffers, PanelKv, Shape as PanelShape, Visible};

use candle_core::{D, Tensor};

use super::fused;
use super::matmul::matmul_t;
use crate::error::{Error, Result};

/// `softmax` over the last dimension, numerically stable.
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    if let Some(y) = fused::scaled_softmax(x, 1.0) {
        return y;
    }
    let max = x.max_keepdim(D::Minus1)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(D::Minus1)?;
    Ok(e.broadcast_div(&s)?)
}

/// Non-causal grouped-query attention for one request.
///
/// `q` is `[Q, heads, hd]`; `k`, `v` are `[kv_heads, S, hd]` (keys already normed and rotated).
/// Query head `h` reads key/value head `h / (heads / kv_heads)`. Returns `[Q, heads·hd]`.
pub fn gqa_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
    if let Some(y) = host::grouped_attention(q, k, v, scale, false) {
        return y;
    }
    let (q_len, heads, hd) = q.dims3()?;
    let kv_heads = k.dims()[0];
    let groups = heads / kv_heads.max(1);
    // [Q, heads, hd] → [heads, Q, hd] → [kv, groups·Q, hd]
    let q = q
        .transpose(0, 1)?
        .contiguous()?
        .reshape((kv_heads, groups * q_len, hd))?;
    let mut outs = Vec::with_capacity(kv_heads);
    for h in 0..kv_heads {
        // [groups·Q, hd] · [S, hd]ᵀ, then [groups·Q, S] · ([S, hd]ᵀ as [hd, S])ᵀ.
        let (qh, kh) = (q.get(h)?, k.get(h)?);
        let scores = matmul_t(&qh, &kh, None)?;
        let probs = match fused::scaled_softmax(&scores, scale) {
            Some(p) => p?,
            None => softmax_last(&(scores * scale)?)?,
        };
        let vt = v.get(h)?.t()?.contiguous()?;
        outs.push(matmul_t(&probs, &vt, None)?);
    }
    heads_to_rows(&outs, (q_len, heads, hd))
}

/// [`causal_gqa_attention`] against a cache that keeps its keys transposed, `kt: [kv_heads, hd,
/// cap]`, and its values token-major, `v: [cap, kv_heads, hd]`, of which the first `s` tokens
/// are live: on the CPU the keys are read where they lie (no per-call packing), elsewhere the
/// live keys are transposed back and [`causal_gqa_attention`] runs.
pub fn causal_gqa_attention_kt(
    q: &Tensor,
    kt: &Tensor,
    v: &Tensor,
    s: usize,
    scale: f64,
) -> Result<Tensor> {
    if let Some(y) = host::causal_attention_kt(q, kt, v, s, scale) {
        return y;
    }
    let k = kt.narrow(2, 0, s)?.permute((2, 0, 1))?.contiguous()?;
    causal_gqa_attention(q, &k, &v.narrow(0, 0, s)?, scale)
}

/// Causal grouped-query attention of `Q` new tokens against a KV cache, for one request.
///
/// `q` is `[Q, heads, hd]`; `k`, `v` are token-major `[S, kv_heads, hd]` with `S >= Q` (keys
/// already normed and rotated): rows `0 .. S − Q` are the cached context, the last `Q` rows
/// the new tokens themselves. Query `i` sees keys `0 ..= S − Q + i`. Query head `h` reads
/// key/value head `h / (heads / kv_heads)`. Returns `[Q, heads·hd]`. Contiguous f32 CPU
/// inputs take the single-pass kernel; anything else a masked candle path.
pub fn causal_gqa_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Tensor> {
    if let Some(y) = host::grouped_attention(q, k, v, scale, true) {
        return y;
    }
    let (q_len, heads, hd) = q.dims3()?;
    let (s, kv_heads, _) = k.dims3()?;
    if s < q_len || kv_heads == 0 || !heads.is_multiple_of(kv_heads) || v.dims() != k.dims() {
        return Err(Error::bad_shape(
            "k",
            format!(
                "q {:?}, k {:?}, v {:?}: need [S >= Q, kv_heads | heads, hd]",
                q.dims(),
                k.dims(),
                v.dims()
            ),
        ));
    }
    let groups = heads / kv_heads;
    let past = s - q_len;
    let visible = |i: usize, j: usize| {
        if j <= past + i {
            0.0
        } else {
            f32::NEG_INFINITY
        }
    };
    let mask: Vec<f32> = (0..q_len)
        .flat_map(|i| (0..s).map(move |j| visible(i, j)))
        .collect();
    let mask = Tensor::from_vec(mask, (1, q_len, s), q.device())?.to_dtype(q.dtype())?;
    let mut outs = Vec::with_capacity(kv_heads);
    for h in 0..kv_heads {
        // [Q, groups, hd] → [groups, Q, hd] → [groups·Q, hd]
        let qh = q
            .narrow(1, h * groups, groups)?
            .transpose(0, 1)?
            .contiguous()?
            .reshape((groups * q_len, hd))?;
        let kh = k.narrow(1, h, 1)?.squeeze(1)?.contiguous()?;
        let vh = v.narrow(1, h, 1)?.squeeze(1)?.contiguous()?;
        let scores = (matmul_t(&qh, &kh, None)? * scale)?
            .reshape((groups, q_len, s))?
            .broadcast_add(&mask)?;
        let probs = softmax_last(&scores)?.reshape((groups * q_len, s))?;
        outs.push(probs.matmul(&vh)?); // [groups·Q, hd]
    }
    heads_to_rows(&outs, (q_len, heads, hd))
}

/// Per-key/value-head outputs `[groups·Q, hd]` (query `i` of head `kh·groups + g` at row
/// `g·Q + i` of `outs[kh]`) as `[Q, heads·hd]`.
fn heads_to_rows(outs: &[Tensor], (q_len, heads, hd): (usize, usize, usize)) -> Result<Tensor> {
    let out = Tensor::stack(outs, 0)?; // [kv, groups·Q, hd]
    Ok(out
        .reshape((heads, q_len, hd))?
        .transpose(0, 1)?
        .contiguous()?
        .reshape((q_len, heads * hd))?)
}
