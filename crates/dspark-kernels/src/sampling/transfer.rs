//! Host ↔ device movement of the generic path: inputs uploaded once per call, results
//! downloaded as one small vector.

use candle_core::{DType, Device, Tensor};

use crate::error::{Error, Result};
use crate::view::Floats;

/// Upload host values as a tensor of shape `dims` on `dev` (same dtype, one copy).
pub(crate) fn upload(data: Floats<'_>, dims: &[usize], dev: &Device) -> Result<Tensor> {
    Ok(match data {
        Floats::F32(v) => Tensor::from_slice(v, dims, dev)?,
        Floats::F16(v) => Tensor::from_slice(v, dims, dev)?,
        Floats::BF16(v) => Tensor::from_slice(v, dims, dev)?,
    })
}

/// Check that `t` holds floating-point values the kernels accept (f32, f16 or bf16).
pub(crate) fn check_float(t: &Tensor, name: &str) -> Result<()> {
    match t.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        other => Err(Error::UnsupportedDtype {
            name: name.to_string(),
            message: format!("{other:?} (need f32, f16 or bf16)"),
        }),
    }
}

/// Small per-row results, gathered into one f64 vector with a single device→host copy.
#[derive(Default)]
pub(crate) struct Download {
    parts: Vec<Tensor>,
    lens: Vec<usize>,
}

impl Download {
    /// Queue `t` (any shape, any numeric dtype; ids below `2^53` stay exact); returns its slot.
    pub fn push(&mut self, t: &Tensor) -> Result<usize> {
        let flat = t.flatten_all()?.to_dtype(DType::F64)?;
        self.lens.push(flat.dim(0)?);
        self.parts.push(flat);
        Ok(self.parts.len() - 1)
    }

    /// Copy everything to the host, in queue order.
    pub fn fetch(self) -> Result<Fetched> {
        let values = if self.parts.is_empty() {
            Vec::new()
        } else {
            Tensor::cat(&self.parts, 0)?.to_vec1::<f64>()?
        };
        let mut offsets = Vec::with_capacity(self.lens.len());
        let mut at = 0;
        for n in self.lens {
            offsets.push((at, n));
            at += n;
        }
        Ok(Fetched { values, offsets })
    }
}

/// The host copy of a [`Download`].
pub(crate) struct Fetched {
    values: Vec<f64>,
    offsets: Vec<(usize, usize)>,
}

impl Fetched {
    /// The values of slot `i`.
    pub fn get(&self, i: usize) -> &[f64] {
        let (at, n) = self.offsets[i];
        &self.values[at..at + n]
    }
}
