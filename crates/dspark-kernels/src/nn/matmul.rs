//! The small-row product `x · wᵀ` on candle tensors, for everything [`super::Linear`] does not
//! pack: inputs of at most [`SMALL_ROWS`] rows (host fast path, f32 rows against an f32, bf16
//! or f16 weight) through the register-blocked dot kernel of the Markov bias, each weight row
//! read once straight from the tensor's storage and split over the pool by column chunks only
//! for large weights (from [`PAR_MIN_MACS`]); the rest through candle's matmul, the branch a
//! CUDA device runs.

use candle_core::{DType, Tensor};
use rayon::prelude::*;

use super::WeightDtype;
use crate::cpu::bias_block;
use crate::cpu::par::PAR_MIN_MACS;
use crate::device::{fast_on, host_fast};
use crate::error::Result;
use crate::view::{Mat, borrow_floats};

/// Input rows up to which [`matmul_t`] uses the dot kernel instead of GEMM.
pub const SMALL_ROWS: usize = 32;

/// `true` when `t` is a weight the host kernels read where it lies: an f32, bf16 or f16
/// tensor on the host fast path ([`fast_on`]).
pub(super) fn host_weight(t: &Tensor) -> bool {
    WeightDtype::of_candle(t.dtype()).is_some() && fast_on(t.device())
}

/// `x · wᵀ (+ bias)` for `x: [N, in]` and `w: [out, in]`, giving `[N, out]`: the dot kernel when
/// `x` is contiguous f32 on the host fast path and `w` an f32, bf16 or f16 weight there (in
/// chunks of [`SMALL_ROWS`] rows when `w` is not f32: each chunk reads it once), candle's
/// matmul otherwise (any device or dtype, and its shape errors). There f32 rows against a
/// bf16 or f16 weight are rounded to the weight's dtype and the product (accumulated in f32)
/// widened back: the weight is read as it is stored, never converted per call.
pub fn matmul_t(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if let Some(y) = matmul_t_small(x, w, bias)? {
        return Ok(y);
    }
    if let &[n, _] = x.dims()
        && w.dtype() != DType::F32
        && host_weight(w)
        && n > SMALL_ROWS
        && host_fast(x)
    {
        let mut parts = Vec::with_capacity(n.div_ceil(SMALL_ROWS));
        for i0 in (0..n).step_by(SMALL_ROWS) {
            let rows = x.narrow(0, i0, SMALL_ROWS.min(n - i0))?.contiguous()?;
            parts.push(matmul_t(&rows, w, bias)?);
        }
        return Ok(Tensor::cat(&parts, 0)?);
    }
    let y = if w.dtype() == x.dtype() {
        x.matmul(&w.t()?)?
    } else if x.dtype() == DType::F32 && matches!(w.dtype(), DType::BF16 | DType::F16) {
        x.to_dtype(w.dtype())?
            .matmul(&w.t()?)?
            .to_dtype(DType::F32)?
    } else {
        x.matmul(&w.to_dtype(x.dtype())?.t()?)?
    };
    Ok(match bias {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    })
}

/// The dot-kernel path of [`matmul_t`]; `None` when it does not apply.
fn matmul_t_small(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Option<Tensor>> {
    let &[n, d_in] = x.dims() else {
        return Ok(None);
    };
    if n == 0
        || n > SMALL_ROWS
        || !host_fast(x)
        || !host_weight(w)
        || bias.is_some_and(|b| !host_fast(b))
    {
        return Ok(None);
    }
    let &[out, w_in] = w.dims() else {
        return Ok(None);
    };
    if w_in != d_in || out == 0 || d_in == 0 {
        return Ok(None);
    }
    let mut y = match bias {
        Some(b) if b.dims() == [out] => b.to_vec1::<f32>()?.repeat(n),
        Some(_) => return Ok(None),
        None => vec![0f32; n * out],
    };
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    let done = borrow_floats(w, |data| {
        let mat = Mat {
            data,
            dims: [out, d_in],
        };
        dots_into(mat, n, &xs, &mut y);
    });
    if done.is_none() {
        return Ok(None);
    }
    Ok(Some(Tensor::from_vec(y, (n, out), x.device())?))
}

/// `y[i] += xs[i] · matᵀ` for `n` rows, with the dot kernel: split over the pool by column
/// chunks for large weights (each weight row still read once, by one worker).
fn dots_into(mat: Mat<'_>, n: usize, xs: &[f32], y: &mut [f32]) {
    let [out, d_in] = mat.dims;
    let work = n * out * d_in;
    let bytes = out * d_in * mat.data.elem_bytes();
    if (work >= PAR_MIN_MACS && crate::threads::use_pool(work))
        || crate::threads::split_stream(bytes)
    {
        let chunk = out.div_ceil(rayon::current_num_threads() * 4).max(16);
        let mut parts: Vec<Vec<&mut [f32]>> = (0..out.div_ceil(chunk))
            .map(|_| Vec::with_capacity(n))
            .collect();
        for row in y.chunks_mut(out) {
            for (c, part) in row.chunks_mut(chunk).enumerate() {
                parts[c].push(part);
            }
        }
        parts
            .into_par_iter()
            .enumerate()
            .for_each(|(c, mut dst)| bias_block(mat, c * chunk, xs, &mut dst, 1.0));
    } else {
        let mut rows: Vec<&mut [f32]> = y.chunks_mut(out).collect();
        bias_block(mat, 0, xs, &mut rows, 1.0);
    }
}
