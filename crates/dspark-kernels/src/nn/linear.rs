//! Linear maps on candle tensors (f32 activations), shared by every model.
//!
//! A round multiplies a handful of rows (`B·K` block slots, `K + 1` verified tokens) by each
//! weight. General GEMM is a poor fit there: it repacks the whole weight on every call and
//! splits a few microseconds of work over the thread pool. On the CPU, [`Linear`] keeps its
//! weight packed once, at load, in the weight's own dtype (f32, bf16 or f16: a 2-byte weight
//! stays 2 bytes) for the panel kernel of [`super::packed`] (the output heads get a packed
//! copy, [`output_head`]; attention runs through the same kernel). Everything else goes
//! through [`matmul_t`] (`matmul.rs`).
//!
//! Every host shortcut here (packing, the dot kernel, the single-pass `fused` chains) is taken
//! only on the host fast path ([`crate::device::fast_on`]): with `DSPARK_KERNEL_PATH=tensor`
//! the CPU runs the candle-op branch, the one a CUDA device runs (no cumsum or sort over the
//! vocabulary anywhere in it), so it is tested without a GPU. That branch keeps a 2-byte
//! weight 2 bytes: its products take the activations rounded to the weight's dtype (as the
//! packed kernel and a torch bf16 model do), accumulate in f32 (cuBLAS `COMPUTE_32F`; candle's
//! CPU products widen to f32) and return f32 activations.

use candle_core::{DType, Device, Tensor};
use std::sync::Arc;

use super::WeightDtype;
use super::fused;
use super::matmul::{host_weight, matmul_t};
use super::packed::{PackedWeight, WeightPart};
use super::quant::Quant;
use crate::device::{fast_on, host_fast};
use crate::error::{Error, Result};
use crate::view::{Floats, borrow_floats};

/// Largest output head (elements) that a model also keeps packed for [`output_head`]: the
/// packed copy sits beside the stored head (which the embedding and a drafter may share), so
/// heads above 2^24 elements (64 MiB in f32, 32 MiB in bf16) keep the dot kernel instead of
/// doubling their memory.
pub const PACKED_HEAD_MAX: usize = 1 << 24;

/// A packed copy of an output head `[V, H]` when it takes the host fast path (f32, bf16 or
/// f16 on the CPU, `DSPARK_KERNEL_PATH` not `tensor`; packed in its own dtype) and is at most
/// [`PACKED_HEAD_MAX`] elements (see [`Linear`]); `None` otherwise.
pub fn output_head(head: &Tensor) -> Result<Option<Linear>> {
    let host = host_weight(head) && head.rank() == 2;
    if !host || head.elem_count() > PACKED_HEAD_MAX {
        return Ok(None);
    }
    Linear::new(head.clone(), None).map(Some)
}

/// `bias` as a map of `out` outputs keeps it: `[out]` (else `bad-shape`), in f32.
fn checked_bias(bias: Option<Tensor>, out: usize) -> Result<Option<Tensor>> {
    if let Some(b) = bias.as_ref().filter(|b| b.dims() != [out]) {
        return Err(Error::bad_shape(
            "bias",
            format!("{:?} for a weight of {out} outputs", b.dims()),
        ));
    }
    bias.map(|b| super::f32_of(&b)).transpose()
}

/// A linear map `y = x · Wᵀ (+ b)` with `W` given `[out, in]` (PyTorch layout).
///
/// On the host fast path the weight is kept in [`PackedWeight`] panels of its own dtype (f32,
/// bf16 or f16: instead of, not beside, the `[out, in]` tensor) and every product runs the
/// panel kernel (a bf16 weight by the pair rule of [`super::packed`]: activations rounded to
/// bf16, as a torch bf16 model reads them); elsewhere it stays a candle tensor in its dtype
/// and goes through [`matmul_t`]. Activations and results are f32.
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
    Packed(Arc<PackedWeight>, Option<Arc<Vec<f32>>>),
}

impl Linear {
    /// `weight: [out, in]` (f32, bf16 or f16; packed in that dtype on the host fast path),
    /// `bias: [out]`. Errors: `bad-shape` for a weight that is not 2-D or a bias that is not
    /// `[out]`.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        let &[out, d_in] = weight.dims() else {
            return Err(Error::bad_shape(
                "weight",
                format!("{:?}: a linear weight is [out, in]", weight.dims()),
            ));
        };
        let bias = checked_bias(bias, out)?;
        let dtype = WeightDtype::of_candle(weight.dtype());
        let host = host_weight(&weight) && bias.as_ref().is_none_or(host_fast);
        let (Some(dtype), true) = (dtype, host) else {
            // The device-generic path: f32, bf16 or f16 stays as it is (2 bytes a weight);
            // any other dtype computes in f32.
            let weight = match dtype {
                Some(_) => weight,
                None => super::f32_of(&weight)?,
            };
            return Ok(Self {
                weight: Weight::Tensor(weight),
                bias,
            });
        };
        let weight = weight.contiguous()?;
        let packed = borrow_floats(&weight, |w| PackedWeight::pack(w, out, d_in, dtype))
            .flatten()
            .ok_or_else(|| Error::bad_shape("weight", "data does not fill [out, in]"))?;
        Self::packed(packed, bias)
    }

    /// `weight: [out, in]` quantized as `quant` blocks (from any float dtype), `bias: [out]`
    /// kept in f32. On the host fast path the blocks replace the weight and every product runs
    /// the quantized kernel ([`crate::nn::quant`]); elsewhere (the device-generic path) the
    /// weight becomes an f32 tensor of the values the blocks hold, so both paths compute with
    /// the same weights. Errors: as [`Self::new`]; `invalid-argument` naming `weight` when a
    /// value is not finite or too large for the format's f16 scales.
    pub fn quantized(weight: Tensor, bias: Option<Tensor>, quant: Quant) -> Result<Self> {
        let &[out, d_in] = weight.dims() else {
            return Err(Error::bad_shape(
                "weight",
                format!("{:?}: a linear weight is [out, in]", weight.dims()),
            ));
        };
        let host = host_weight(&weight) && bias.as_ref().is_none_or(host_fast);
        let weight = weight.contiguous()?;
        let packed = match WeightDtype::of_candle(weight.dtype()) {
            Some(_) => borrow_floats(&weight, |w| PackedWeight::quantize(w, out, d_in, quant)),
            None => {
                let w = super::f32_of(&weight)?.flatten_all()?.to_vec1::<f32>()?;
                Some(PackedWeight::quantize(Floats::F32(&w), out, d_in, quant))
            }
        }
        .flatten()
        .ok_or_else(|| {
            Error::invalid(
                "weight",
                format!(
                    "a [{out}, {d_in}] weight cannot be quantized as {}: a value is not \
                     finite or too large for its f16 scales",
                    quant.as_str()
                ),
            )
        })?;
        if !host {
            let values = Tensor::from_vec(packed.unpack(), (out, d_in), weight.device())?;
            return Self::new(values, bias);
        }
        let bias = checked_bias(bias, out)?;
        Self::packed(packed, bias)
    }

    /// A map over a weight already in blocks or panels (a GGUF file's quantized matrix),
    /// `bias: [out]` kept in f32: on the host fast path (`device` the CPU) the blocks are kept
    /// as they are; elsewhere the weight becomes an f32 tensor of their values on `device`, so
    /// both paths compute with the same weights. Errors: `bad-shape` for a bias that is not
    /// `[out]`.
    pub fn from_packed(
        packed: PackedWeight,
        bias: Option<Tensor>,
        device: &Device,
    ) -> Result<Self> {
        let (out, d_in) = (packed.rows(), packed.cols());
        if !fast_on(device) || bias.as_ref().is_some_and(|b| !host_fast(b)) {
            let values = Tensor::from_vec(packed.unpack(), (out, d_in), device)?;
            return Self::new(values, bias);
        }
        let bias = checked_bias(bias, out)?;
        Self::packed(packed, bias)
    }

    /// A map over a host-packed weight, its bias (checked, f32) kept beside it as a host copy
    /// for the kernels.
    fn packed(packed: PackedWeight, bias: Option<Tensor>) -> Result<Self> {
        let b = bias
            .as_ref()
            .map(|b| b.to_vec1::<f32>().map(Arc::new))
            .transpose()?;
        Ok(Self {
            weight: Weight::Packed(Arc::new(packed), b),
            bias,
        })
    }

    /// A map over host-packed rows already shared (an output head tied to a packed embedding:
    /// one copy of the blocks for both), without a bias.
    pub fn from_shared(packed: Arc<PackedWeight>) -> Self {
        Self {
            weight: Weight::Packed(packed, None),
            bias: None,
        }
    }

    /// The packed weight, when the map keeps one (the host fast path).
    pub fn packed_weight(&self) -> Option<&Arc<PackedWeight>> {
        match &self.weight {
            Weight::Packed(w, _) => Some(w),
            Weight::Tensor(_) => None,
        }
    }

    /// The quantized format of the weight, when it is quantized.
    pub fn quant(&self) -> Option<Quant> {
        match &self.weight {
            Weight::Packed(w, _) => w.quant(),
            Weight::Tensor(_) => None,
        }
    }

    /// One map whose outputs are `parts`' outputs side by side, for the device-generic path:
    /// one product (one launch, one larger GEMM) instead of one per part. Only when every part
    /// keeps a candle weight (not packed) of one dtype and input width, all with a bias or
    /// none; `None` (parts untouched) otherwise. Each part's weight and bias become row views
    /// of the stacked ones, so the weights are held once.
    pub(crate) fn stack(parts: &mut [&mut Linear]) -> Result<Option<Linear>> {
        let mut weights = Vec::with_capacity(parts.len());
        for p in parts.iter() {
            match &p.weight {
                Weight::Tensor(w) => weights.push(w.clone()),
                Weight::Packed(..) => return Ok(None),
            }
        }
        let (Some(first), true) = (weights.first(), parts.len() > 1) else {
            return Ok(None);
        };
        let same = weights
            .iter()
            .all(|w| w.dtype() == first.dtype() && w.dims().get(1) == first.dims().get(1));
        let biased = parts.iter().filter(|p| p.bias.is_some()).count();
        if !same || (biased != 0 && biased != parts.len()) {
            return Ok(None);
        }
        let weight = Tensor::cat(&weights, 0)?;
        let bias = if biased == 0 {
            None
        } else {
            let b: Vec<Tensor> = parts.iter().filter_map(|p| p.bias.clone()).collect();
            Some(Tensor::cat(&b, 0)?)
        };
        let stacked = Linear {
            weight: Weight::Tensor(weight),
            bias,
        };
        let mut at = 0;
        for p in parts.iter_mut() {
            let rows = p.out_dim();
            if let Some(view) = stacked.rows(at, rows)? {
                **p = view;
            }
            at += rows;
        }
        Ok(Some(stacked))
    }

    /// Outputs `start .. start + len` of this map as a map of its own, sharing the weight (row
    /// views, no copy); `None` for a packed weight.
    pub(crate) fn rows(&self, start: usize, len: usize) -> Result<Option<Linear>> {
        let Weight::Tensor(w) = &self.weight else {
            return Ok(None);
        };
        Ok(Some(Linear {
            weight: Weight::Tensor(w.narrow(0, start, len)?),
            bias: self
                .bias
                .as_ref()
                .map(|b| b.narrow(0, start, len))
                .transpose()?,
        }))
    }

    /// The dtype the weight is kept in.
    pub fn weight_dtype(&self) -> WeightDtype {
        match &self.weight {
            Weight::Tensor(t) => WeightDtype::of_candle(t.dtype()).unwrap_or(WeightDtype::F32),
            Weight::Packed(w, _) => w.dtype(),
        }
    }

    /// Bytes of the weight one product reads.
    pub fn weight_bytes(&self) -> usize {
        match &self.weight {
            Weight::Tensor(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Weight::Packed(w, _) => w.bytes(),
        }
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

    /// [`Self::forward`] of every layer of `layers` on one `x`, in order. On the host fast
    /// path, when every weight is packed in one dtype, the products share one pool dispatch
    /// ([`PackedWeight::matmul_group`]; a layer's q, k and v projections, its gate and up
    /// projections) with each one's bits; otherwise each layer runs on its own.
    pub fn forward_many<const N: usize>(layers: [&Self; N], x: &Tensor) -> Result<[Tensor; N]> {
        let ys = Self::forward_group(&layers, x)?;
        ys.try_into().map_err(|_| Error::Internal {
            message: "a grouped product lost an output".into(),
        })
    }

    /// [`Self::forward_many`] over a slice.
    fn forward_group(layers: &[&Self], x: &Tensor) -> Result<Vec<Tensor>> {
        let packed: Option<Vec<WeightPart<'_>>> = layers
            .iter()
            .map(|l| match &l.weight {
                Weight::Packed(w, b) => Some((w.as_ref(), b.as_deref().map(Vec::as_slice))),
                Weight::Tensor(_) => None,
            })
            .collect();
        let each = || layers.iter().map(|l| l.forward(x)).collect();
        let dims = x.dims();
        let (Some(parts), true, true) = (packed, layers.len() > 1, host_fast(x)) else {
            return each();
        };
        let cols = dims.last().copied().unwrap_or(0);
        if dims.len() < 2 || parts.iter().any(|(w, _)| w.cols() != cols) {
            return each();
        }
        let n = dims[..dims.len() - 1].iter().product();
        // Read in place when contiguous (no copy of the activations), else one copy.
        let ys = match fused::with_f32(x, |xs| PackedWeight::matmul_group(&parts, xs, n)) {
            Some(ys) => ys,
            None => PackedWeight::matmul_group(&parts, &x.flatten_all()?.to_vec1::<f32>()?, n),
        };
        let Some(ys) = ys else {
            // Weights of mixed dtypes: one product each.
            return each();
        };
        ys.into_iter()
            .zip(&parts)
            .map(|(y, (w, _))| {
                let mut shape = dims.to_vec();
                if let Some(last) = shape.last_mut() {
                    *last = w.rows();
                }
                Ok(Tensor::from_vec(y, shape, x.device())?)
            })
            .collect()
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

/// Ensure `t` is `f32` (the drafter's compute dtype).
pub fn f32_of(t: &Tensor) -> Result<Tensor> {
    Ok(if t.dtype() == DType::F32 {
        t.clone()
    } else {
        t.to_dtype(DType::F32)?
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn weight(seed: u64, rows: usize, cols: usize, dtype: DType) -> Tensor {
        let v: Vec<f64> = (0..rows * cols)
            .map(|i| ((i as u64 * 2_654_435_761 + seed * 97) % 1000) as f64 / 1000.0 - 0.5)
            .collect();
        Tensor::from_vec(v, (rows, cols), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    }

    /// Stacked maps give each part's outputs side by side, and the parts become views of the
    /// stacked weight (held once). An f64 weight keeps a candle tensor (the device path's kind)
    /// on any kernel path; a packed host weight is never stacked.
    #[test]
    fn stacked_maps_equal_their_parts() {
        let x = weight(9, 3, 8, DType::F32);
        let bias = |n: usize| Some(weight(5, 1, n, DType::F32).flatten_all().unwrap());
        let mut a = Linear::new(weight(1, 4, 8, DType::F64), bias(4)).unwrap();
        let mut b = Linear::new(weight(2, 6, 8, DType::F64), bias(6)).unwrap();
        let want = [a.forward(&x).unwrap(), b.forward(&x).unwrap()];
        let stacked = Linear::stack(&mut [&mut a, &mut b]).unwrap().unwrap();
        let y = stacked.forward(&x).unwrap();
        assert_eq!(y.dims(), [3, 10]);
        let got = [y.narrow(1, 0, 4).unwrap(), y.narrow(1, 4, 6).unwrap()];
        for (g, w) in got.iter().zip(&want) {
            let d: f32 = (g - w)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar()
                .unwrap();
            assert!(d < 1e-6, "{d}");
        }
        // The parts are views now: same outputs as before.
        let again = b.forward(&x).unwrap();
        let d = (&again - &want[1])
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap();
        assert_eq!(d.to_scalar::<f32>().unwrap(), 0.0);
        // One part with a bias and one without do not stack.
        let mut c = Linear::new(weight(3, 2, 8, DType::F64), None).unwrap();
        assert!(Linear::stack(&mut [&mut a, &mut c]).unwrap().is_none());
        if crate::device::fast_on(&Device::Cpu) {
            let mut p = Linear::new(weight(4, 4, 8, DType::F32), None).unwrap();
            let mut q = Linear::new(weight(6, 4, 8, DType::F32), None).unwrap();
            assert!(Linear::stack(&mut [&mut p, &mut q]).unwrap().is_none());
        }
    }
}
