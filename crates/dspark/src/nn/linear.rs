//! Linear maps on candle tensors in `f32`, shared by every model.
//!
//! A round multiplies a handful of rows (`B·K` block slots, `K + 1` verified tokens) by each
//! weight. General GEMM is a poor fit there: it repacks the whole weight on every call and
//! splits a few microseconds of work over the thread pool. On the CPU in f32, [`Linear`] keeps
//! its weight packed once, at load, for the panel kernel of [`super::packed`] (the output heads
//! get a packed copy, [`output_head`]; attention runs through the same kernel). [`matmul_t`]
//! remains for everything else: inputs of at most [`SMALL_ROWS`] rows (f32, CPU) go through the
//! register-blocked dot kernel of the Markov bias (each weight row read once, straight from the
//! tensor's storage; split over the pool by column chunks only for large weights, from
//! [`PAR_MIN_MACS`](crate::cpu::par::PAR_MIN_MACS)), the rest through candle's matmul.
//!
//! Every host shortcut here (packing, the dot kernel, the single-pass `fused` chains) is taken
//! only for tensors that pass [`crate::device::host_fast`]: with `DSPARK_KERNEL_PATH=tensor`
//! the CPU runs the candle-op branch, the one a CUDA device runs (no cumsum or sort over the
//! vocabulary anywhere in it), so it is tested without a GPU.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};
use rayon::prelude::*;

use std::sync::Arc;

use super::fused;
use super::packed::PackedMatrix;
use crate::cpu::bias_block;
use crate::cpu::par::PAR_MIN_MACS;
use crate::device::host_fast;
use crate::error::{Error, Result};
use crate::view::{Floats, Mat};

/// Input rows up to which [`matmul_t`] uses the dot kernel instead of GEMM.
pub const SMALL_ROWS: usize = 32;

/// Largest output head (elements) that a model also keeps packed for [`output_head`]: the
/// packed copy sits beside the stored head (which the embedding and a drafter may share), so
/// heads above 64 MiB of f32 keep the dot kernel instead of doubling their memory.
pub const PACKED_HEAD_MAX: usize = 1 << 24;

/// A packed copy of an output head `[V, H]` when it takes the host fast path
/// ([`crate::device::host_fast`]: CPU, f32, `DSPARK_KERNEL_PATH` not `tensor`) and is at most
/// [`PACKED_HEAD_MAX`] elements (see [`Linear`]); `None` otherwise.
pub fn output_head(head: &Tensor) -> Result<Option<Linear>> {
    let host = host_fast(head) && head.rank() == 2;
    if !host || head.elem_count() > PACKED_HEAD_MAX {
        return Ok(None);
    }
    Linear::new(head.clone(), None).map(Some)
}

/// A linear map `y = x · Wᵀ (+ b)` with `W` given `[out, in]` (PyTorch layout).
///
/// On the CPU in f32 the weight is kept in [`PackedMatrix`] panels (instead of, not beside,
/// the `[out, in]` tensor) and every product runs the panel kernel; elsewhere it stays a candle
/// tensor and goes through [`matmul_t`].
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Weight,
    /// `[out]`, if the layer has a bias.
    bias: Option<Tensor>,
}

#[derive(Debug, Clone)]
enum Weight {
    Tensor(Tensor),
    /// The packed weight and the bias on the host.
    Packed(Arc<PackedMatrix>, Option<Arc<Vec<f32>>>),
}

impl Linear {
    /// `weight: [out, in]`, `bias: [out]`. Errors: `bad-shape` for a weight that is not 2-D
    /// or a bias that is not `[out]`.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        let &[out, d_in] = weight.dims() else {
            return Err(Error::bad_shape(
                "weight",
                format!("{:?}: a linear weight is [out, in]", weight.dims()),
            ));
        };
        if let Some(b) = bias.as_ref().filter(|b| b.dims() != [out]) {
            return Err(Error::bad_shape(
                "bias",
                format!("{:?} for a weight of {out} outputs", b.dims()),
            ));
        }
        if !host_fast(&weight) || bias.as_ref().is_some_and(|b| !host_fast(b)) {
            return Ok(Self {
                weight: Weight::Tensor(weight),
                bias,
            });
        }
        let w = weight.flatten_all()?.to_vec1::<f32>()?;
        let packed = PackedMatrix::pack(&w, out, d_in)
            .ok_or_else(|| Error::bad_shape("weight", "data does not fill [out, in]"))?;
        let b = bias
            .as_ref()
            .map(|b| b.to_vec1::<f32>().map(Arc::new))
            .transpose()?;
        Ok(Self {
            weight: Weight::Packed(Arc::new(packed), b),
            bias,
        })
    }

    /// Apply to `x` of shape `[.., in]`, giving `[.., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.weight {
            Weight::Packed(w, b) if host_fast(x) => {
                let dims = x.dims();
                let d_in = dims.last().copied().unwrap_or(0);
                if dims.len() < 2 || d_in != w.cols() {
                    return Err(Error::bad_shape(
                        "x",
                        format!("{dims:?} into a linear map of {} inputs", w.cols()),
                    ));
                }
                let n = dims[..dims.len() - 1].iter().product();
                let bias = b.as_deref().map(Vec::as_slice);
                // Read in place when contiguous (no copy of the activations), else one copy.
                let y = match fused::with_f32(x, |xs| w.matmul(xs, n, bias)) {
                    Some(y) => y,
                    None => w.matmul(&x.flatten_all()?.to_vec1::<f32>()?, n, bias),
                }
                .ok_or_else(|| Error::bad_shape("x", "does not fill [.., in]"))?;
                let mut shape = dims.to_vec();
                if let Some(last) = shape.last_mut() {
                    *last = w.rows();
                }
                Ok(Tensor::from_vec(y, shape, x.device())?)
            }
            Weight::Packed(..) => matmul_t(x, &self.weight()?, self.bias.as_ref()),
            Weight::Tensor(w) => {
                // Rows of any leading shape as one `[N, in]` product (candle's matmul does not
                // broadcast a 2-D weight over a batch), with the packed arm's shape errors.
                let dims = x.dims();
                let d_in = w.dims().get(1).copied().unwrap_or(0);
                if dims.len() < 2 || dims.last() != Some(&d_in) {
                    return Err(Error::bad_shape(
                        "x",
                        format!("{dims:?} into a linear map of {d_in} inputs"),
                    ));
                }
                if dims.len() == 2 {
                    return matmul_t(x, w, self.bias.as_ref());
                }
                let n: usize = dims[..dims.len() - 1].iter().product();
                let y = matmul_t(&x.reshape((n, d_in))?, w, self.bias.as_ref())?;
                let mut shape = dims.to_vec();
                if let Some(last) = shape.last_mut() {
                    *last = self.out_dim();
                }
                Ok(y.reshape(shape)?)
            }
        }
    }

    /// The weight as a `[out, in]` tensor (unpacked into a new tensor when packed).
    pub fn weight(&self) -> Result<Tensor> {
        Ok(match &self.weight {
            Weight::Tensor(t) => t.clone(),
            Weight::Packed(w, _) => {
                Tensor::from_vec(w.unpack(), (w.rows(), w.cols()), &Device::Cpu)?
            }
        })
    }

    /// The bias, if the layer has one.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        match &self.weight {
            Weight::Tensor(t) => t.dims().first().copied().unwrap_or(0),
            Weight::Packed(w, _) => w.rows(),
        }
    }
}

/// `x · wᵀ (+ bias)` for `x: [N, in]` and `w: [out, in]`, giving `[N, out]`: the dot kernel when
/// `N <= SMALL_ROWS` and everything is contiguous f32 on the CPU, candle's matmul otherwise
/// (any device or dtype, and its shape errors).
pub fn matmul_t(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    if let Some(y) = matmul_t_small(x, w, bias)? {
        return Ok(y);
    }
    let y = x.matmul(&w.t()?)?;
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
        || !host_fast(w)
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
    let (storage, layout) = w.storage_and_layout();
    let (Storage::Cpu(CpuStorage::F32(all)), Some((lo, hi))) =
        (&*storage, layout.contiguous_offsets())
    else {
        return Ok(None);
    };
    let mat = Mat {
        data: Floats::F32(&all[lo..hi]),
        dims: [out, d_in],
    };
    if n * out * d_in >= PAR_MIN_MACS && crate::threads::use_pool(n * out * d_in) {
        // A large weight: column chunks of every row in parallel (each weight row still read
        // once, by one worker).
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
            .for_each(|(c, mut dst)| bias_block(mat, c * chunk, &xs, &mut dst, 1.0));
    } else {
        let mut rows: Vec<&mut [f32]> = y.chunks_mut(out).collect();
        bias_block(mat, 0, &xs, &mut rows, 1.0);
    }
    drop(storage);
    Ok(Some(Tensor::from_vec(y, (n, out), x.device())?))
}

/// Ensure `t` is `f32` (the drafter's compute dtype).
pub fn f32_of(t: &Tensor) -> Result<Tensor> {
    Ok(if t.dtype() == DType::F32 {
        t.clone()
    } else {
        t.to_dtype(DType::F32)?
    })
}
