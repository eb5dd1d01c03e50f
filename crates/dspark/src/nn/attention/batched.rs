//! Grouped-query attention over a whole batch in a fixed number of candle ops: the device-
//! generic path of the drafter's block pass. Every request and every head goes through one
//! batched product for the scores and one for the values, so the number of ops (kernel
//! launches on a GPU) does not depend on the batch size or the number of heads. Requests whose
//! contexts differ in length are padded to the longest and the padding masked out.

use candle_core::{D, Tensor};

use crate::error::{Error, Result};

/// Non-causal attention of `Q` queries per request against `S` keys per request.
///
/// - `q`: `[B, Q, heads, hd]` (normed and rotated);
/// - `k`, `v`: `[B, kv_heads, S, hd]` (keys normed and rotated), head-major as a
///   [`crate::drafter::DraftState`] keeps them;
/// - `mask`: `[B, 1, S]`, added to the scores: `0` for a live key, `-inf` for padding;
///   `None` when every key is live.
///
/// Query head `h` reads key/value head `h / (heads / kv_heads)`. Returns `[B·Q, heads·hd]`.
pub fn batched_gqa_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
) -> Result<Tensor> {
    let (b, q_len, heads, hd) = q.dims4()?;
    let (kb, kv_heads, s, khd) = k.dims4()?;
    let bad = kb != b
        || khd != hd
        || kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
        || v.dims() != k.dims()
        || mask.is_some_and(|m| m.dims() != [b, 1, s]);
    if bad {
        return Err(Error::bad_shape(
            "k",
            format!(
                "q {:?}, k {:?}, v {:?}, mask {:?}: need q [B, Q, heads, hd], k = v [B, kv_heads \
                 | heads, S, hd], mask [B, 1, S]",
                q.dims(),
                k.dims(),
                v.dims(),
                mask.map(Tensor::dims)
            ),
        ));
    }
    crate::trace::attention();
    let groups = heads / kv_heads;
    // [B, Q, kv, g, hd] → [B, kv, g, Q, hd] → [B·kv, g·Q, hd]: a query group reads one KV head.
    let q = q
        .reshape((b, q_len, kv_heads, groups, hd))?
        .permute((0, 2, 3, 1, 4))?
        .contiguous()?
        .reshape((b * kv_heads, groups * q_len, hd))?;
    let k = k.reshape((b * kv_heads, s, hd))?;
    let v = v.reshape((b * kv_heads, s, hd))?;
    let scores = (q.matmul(&k.t()?)? * scale)?; // [B·kv, g·Q, S]
    let scores = match mask {
        Some(m) => scores
            .reshape((b, kv_heads * groups * q_len, s))?
            .broadcast_add(m)?,
        None => scores,
    };
    let max = scores.max_keepdim(D::Minus1)?;
    let e = scores.broadcast_sub(&max)?.exp()?;
    let probs = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    let out = probs
        .reshape((b * kv_heads, groups * q_len, s))?
        .matmul(&v)?; // [B·kv, g·Q, hd]
    Ok(out
        .reshape((b, kv_heads, groups, q_len, hd))?
        .permute((0, 3, 1, 2, 4))?
        .contiguous()?
        .reshape((b * q_len, heads * hd))?)
}

/// The additive key mask of [`batched_gqa_attention`] for requests whose first `live[b]` of
/// `ctx` context keys are real (the rest padding), followed by `extra` keys every request has
/// (the block's own): `[B, 1, ctx + extra]` on `device`, `None` when nothing is padded.
pub fn padding_mask(
    live: &[usize],
    ctx: usize,
    extra: usize,
    device: &candle_core::Device,
) -> Result<Option<Tensor>> {
    if live.iter().all(|&l| l == ctx) {
        return Ok(None);
    }
    let s = ctx + extra;
    let mut m = vec![0f32; live.len() * s];
    for (row, &l) in m.chunks_exact_mut(s).zip(live) {
        row[l.min(ctx)..ctx].fill(f32::NEG_INFINITY);
    }
    let t = crate::trace::upload(m, (live.len(), 1, s), device)?;
    Ok(Some(t))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::nn::attention::gqa_attention;
    use candle_core::Device;

    fn rand(seed: u64, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let v: Vec<f32> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn max_abs(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    /// Each request alone through the per-request attention (its live keys only) equals its
    /// rows of the batched, padded call.
    #[test]
    fn batched_equals_each_request_alone() {
        let (b, q_len, heads, kvh, hd, s) = (3, 4, 6, 2, 8, 9);
        let q = rand(1, &[b, q_len, heads, hd]);
        let k = rand(2, &[b, kvh, s, hd]);
        let v = rand(3, &[b, kvh, s, hd]);
        let ctx = s - q_len;
        let live = [ctx, 2, 0];
        let mask = padding_mask(&live, ctx, q_len, &Device::Cpu).unwrap();
        let out = batched_gqa_attention(&q, &k, &v, mask.as_ref(), 0.3).unwrap();
        assert_eq!(out.dims(), [b * q_len, heads * hd]);
        for (i, &l) in live.iter().enumerate() {
            let keep = |t: &Tensor| {
                let t = t.get(i).unwrap();
                let c = t.narrow(1, 0, l).unwrap();
                let blk = t.narrow(1, ctx, q_len).unwrap();
                Tensor::cat(&[&c, &blk], 1).unwrap().contiguous().unwrap()
            };
            let alone = gqa_attention(&q.get(i).unwrap(), &keep(&k), &keep(&v), 0.3).unwrap();
            let rows = out.narrow(0, i * q_len, q_len).unwrap();
            assert!(max_abs(&alone, &rows) < 1e-5, "request {i}");
        }
    }

    #[test]
    fn no_padding_no_mask_and_bad_shapes_are_typed() {
        assert!(padding_mask(&[3, 3], 3, 2, &Device::Cpu).unwrap().is_none());
        let q = rand(1, &[2, 2, 4, 8]);
        let k = rand(2, &[2, 3, 5, 8]); // 3 KV heads do not divide 4 query heads
        let err = batched_gqa_attention(&q, &k, &k, None, 1.0).unwrap_err();
        assert_eq!(err.code(), "bad-shape");
    }
}
