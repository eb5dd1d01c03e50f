//! Grouped-query attention over a whole batch in a fixed number of candle ops: the device-
//! generic path of the drafter's block pass and of the native target's forward. Every request and every head goes through one
//! batched product for the scores and one for the values, so the number of ops (kernel
//! launches on a GPU) does not depend on the batch size or the number of heads. Requests whose
//! contexts differ in length are padded to the longest and the padding masked out.

use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{D, Tensor};

use crate::error::{Error, Result};

/// How [`batched_attention`] receives its keys.
#[derive(Debug, Clone, Copy)]
pub enum Keys<'a> {
    /// `[B, kv_heads, S, hd]`, head-major, as a `dspark::DraftState` keeps them.
    Rows(&'a Tensor),
    /// `[B, kv_heads, hd, S]`, transposed, as the native target's cache keeps them.
    Transposed(&'a Tensor),
}

/// Attention of `Q` queries per request against `S` keys per request.
///
/// - `q`: `[B, Q, heads, hd]` (normed and rotated);
/// - `keys`: normed and rotated, in either layout ([`Keys`]); `v`: `[B, kv_heads, S, hd]`;
/// - `mask`: added to the scores, `0` for a key a query sees, `-inf` (or `-1e30`) for one it
///   must not: `[B, 1, 1, S]` for padding ([`padding_mask`]), `[B, 1, Q, S]` per query row
///   ([`causal_mask`]); `None` when every query sees every key.
///
/// Query head `h` reads key/value head `h / (heads / kv_heads)`. Returns `[B·Q, heads·hd]`.
pub fn batched_attention(
    q: &Tensor,
    keys: Keys<'_>,
    v: &Tensor,
    mask: Option<&Tensor>,
    scale: f64,
) -> Result<Tensor> {
    let (b, kv_heads, s, hd) = v.dims4()?;
    let (k, want) = match keys {
        Keys::Rows(k) => (k, [b, kv_heads, s, hd]),
        Keys::Transposed(kt) => (kt, [b, kv_heads, hd, s]),
    };
    if k.dims() != want {
        return Err(shape_error(q, k, v, mask));
    }
    // `[B·kv, hd, S]`: a transposed view of row-major keys, or the stored transposed keys
    // (copied when a view of a longer buffer: the device GEMM wants packed rows).
    let kt = match keys {
        Keys::Rows(k) => k.reshape((b * kv_heads, s, hd))?.t()?,
        Keys::Transposed(kt) => kt.reshape((b * kv_heads, hd, s))?,
    };
    let v = v.reshape((b * kv_heads, s, hd))?;
    attend(q, &kt, &v, (b, kv_heads), mask, scale)
}

fn shape_error(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Error {
    Error::bad_shape(
        "k",
        format!(
            "q {:?}, k {:?}, v {:?}, mask {:?}: need q [B, Q, heads, hd], keys and values of \
             B requests and kv_heads | heads heads, mask [B, 1, 1 or Q, S]",
            q.dims(),
            k.dims(),
            v.dims(),
            mask.map(Tensor::dims)
        ),
    )
}

/// The shared body: `kt` `[B·kv, hd, S]` (a transposed view or stored so), `v` `[B·kv, S, hd]`.
fn attend(
    q: &Tensor,
    kt: &Tensor,
    v: &Tensor,
    (b, kv_heads): (usize, usize),
    mask: Option<&Tensor>,
    scale: f64,
) -> Result<Tensor> {
    let (qb, q_len, heads, hd) = q.dims4()?;
    let (_, khd, s) = kt.dims3()?;
    let bad = qb != b
        || khd != hd
        || kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
        || mask.is_some_and(|m| {
            let d = m.dims();
            d.len() != 4 || d[0] != b || d[1] != 1 || (d[2] != 1 && d[2] != q_len) || d[3] != s
        });
    if bad {
        return Err(shape_error(q, kt, v, mask));
    }
    crate::trace::attention();
    let groups = heads / kv_heads;
    // [B, Q, kv, g, hd] → [B, kv, g, Q, hd] → [B·kv, g·Q, hd]: a query group reads one KV head.
    let q = q
        .reshape((b, q_len, kv_heads, groups, hd))?
        .permute((0, 2, 3, 1, 4))?
        .contiguous()?
        .reshape((b * kv_heads, groups * q_len, hd))?;
    let scores = (q.matmul(kt)? * scale)?; // [B·kv, g·Q, S]
    let scores = match mask {
        Some(m) => scores
            .reshape((b, kv_heads * groups, q_len, s))?
            .broadcast_add(m)?,
        None => scores,
    };
    let max = scores.max_keepdim(D::Minus1)?;
    let e = scores.broadcast_sub(&max)?.exp()?;
    let probs = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    let out = probs
        .reshape((b * kv_heads, groups * q_len, s))?
        .matmul(v)?; // [B·kv, g·Q, hd]
    Ok(out
        .reshape((b, kv_heads, groups, q_len, hd))?
        .permute((0, 3, 1, 2, 4))?
        .contiguous()?
        .reshape((b * q_len, heads * hd))?)
}

/// The additive key mask of [`batched_attention`] for requests whose first `live[b]` of
/// `ctx` context keys are real (the rest padding), followed by `extra` keys every request has
/// (the block's own): `[B, 1, 1, ctx + extra]` on `device`, `None` when nothing is padded.
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
    let t = crate::trace::upload(m, (live.len(), 1, 1, s), device)?;
    Ok(Some(t))
}

/// Added to the scores of a key a query must not see: large enough that its weight is exactly
/// 0 after the softmax's max subtraction, finite so that the mask is one affine op.
const HIDDEN: f64 = 1e30;

/// The causal mask of [`batched_attention`], built on the device: query `(b, i)` at
/// absolute position `query_positions[b, i]` (`u32 [B, Q]`) sees key `j` of `key_index`
/// (`u32 [S]`: `0 .. S`) iff `j <= position`. Returns `[B, 1, Q, S]`: `0` or `-1e30`.
pub fn causal_mask(query_positions: &Tensor, key_index: &Tensor) -> Result<Tensor> {
    let (b, q_len) = query_positions.dims2()?;
    let s = key_index.dims1()?;
    let seen = key_index
        .reshape((1, 1, s))?
        .broadcast_le(&query_positions.reshape((b, q_len, 1))?)?;
    Ok(seen
        .to_dtype(candle_core::DType::F32)?
        .affine(HIDDEN, -HIDDEN)?
        .reshape((b, 1, q_len, s))?)
}

/// `0 .. n` as a `u32` tensor on a device, kept and grown by doubling (the key index of
/// [`causal_mask`]), so a forward builds its mask with no upload.
#[derive(Debug, Clone, Default)]
pub struct IotaCache(Arc<Mutex<Option<Tensor>>>);

impl IotaCache {
    /// `0 .. n` on `device`.
    pub fn get(&self, n: usize, device: &candle_core::Device) -> Result<Tensor> {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let fits = slot
            .as_ref()
            .is_some_and(|t| t.dims1().is_ok_and(|len| len >= n) && t.device().same_device(device));
        if !fits {
            let len = n.next_power_of_two().max(256);
            let len32 =
                u32::try_from(len).map_err(|_| Error::too_large("key index", len, u32::MAX, ""))?;
            *slot = Some(crate::trace::upload(
                (0..len32).collect::<Vec<u32>>(),
                len,
                device,
            )?);
        }
        match slot.as_ref() {
            Some(t) => Ok(t.narrow(0, 0, n)?),
            None => Err(Error::Internal {
                message: "the key index cache lost its tensor".into(),
            }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::nn::attention::gqa_attention;
    use candle_core::Device;

    fn rand(seed: u32, shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        // Seeds spread over the hash's range, so that q, k and v are unrelated.
        let seed = seed.wrapping_mul(0x9E37_79B9);
        Tensor::from_vec(crate::test_values::values(n, seed), shape, &Device::Cpu).unwrap()
    }

    fn max_abs(a: &Tensor, b: &Tensor) -> f32 {
        let d = (a - b).unwrap().abs().unwrap().max_all().unwrap();
        d.to_scalar().unwrap()
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
        let out = batched_attention(&q, Keys::Rows(&k), &v, mask.as_ref(), 0.3).unwrap();
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

    /// The causal path: each request's rows through the per-request causal attention (its own
    /// cache length, its own past) equal its rows of one batched call with the device mask.
    #[test]
    fn batched_causal_equals_each_request_alone() {
        use crate::nn::attention::causal_gqa_attention;
        let (heads, kvh, hd) = (4, 2, 8);
        // (past, new rows) per request; padded to the longest.
        let reqs = [(5usize, 3usize), (0, 2), (9, 1)];
        let b = reqs.len();
        let m = reqs.iter().map(|r| r.1).max().unwrap();
        let s = reqs.iter().map(|r| r.0 + r.1).max().unwrap();
        let q = rand(4, &[b, m, heads, hd]);
        let kt = rand(5, &[b, kvh, hd, s]);
        let v = rand(6, &[b, kvh, s, hd]);
        let qpos: Vec<u32> = reqs
            .iter()
            .flat_map(|&(p, n)| (0..m).map(move |i| (p + i.min(n - 1)) as u32))
            .collect();
        let qpos = Tensor::from_vec(qpos, (b, m), &Device::Cpu).unwrap();
        let iota = IotaCache::default().get(s, &Device::Cpu).unwrap();
        let mask = causal_mask(&qpos, &iota).unwrap();
        let out = batched_attention(&q, Keys::Transposed(&kt), &v, Some(&mask), 0.4).unwrap();
        for (i, &(past, n)) in reqs.iter().enumerate() {
            let len = past + n;
            // Token-major [len, kv, hd] keys and values of request i.
            let live = |t: &Tensor, dim: usize, order: (usize, usize, usize)| {
                let t = t.get(i).unwrap().narrow(dim, 0, len).unwrap();
                t.permute(order).unwrap()
            };
            let (k, vv) = (live(&kt, 2, (2, 0, 1)), live(&v, 1, (1, 0, 2)));
            let qi = q.get(i).unwrap().narrow(0, 0, n).unwrap();
            let alone = causal_gqa_attention(
                &qi,
                &k.contiguous().unwrap(),
                &vv.contiguous().unwrap(),
                0.4,
            )
            .unwrap();
            let rows = out.narrow(0, i * m, n).unwrap();
            assert!(max_abs(&alone, &rows) < 1e-5, "request {i}");
        }
    }

    #[test]
    fn no_padding_no_mask_and_bad_shapes_are_typed() {
        assert!(padding_mask(&[3, 3], 3, 2, &Device::Cpu).unwrap().is_none());
        let m = padding_mask(&[3, 1], 3, 2, &Device::Cpu).unwrap().unwrap();
        assert_eq!(m.dims(), [2, 1, 1, 5]);
        let q = rand(1, &[2, 2, 4, 8]);
        let k = rand(2, &[2, 3, 5, 8]); // 3 KV heads do not divide 4 query heads
        let err = batched_attention(&q, Keys::Rows(&k), &k, None, 1.0).unwrap_err();
        assert_eq!(err.code(), "bad-shape");
    }
}
