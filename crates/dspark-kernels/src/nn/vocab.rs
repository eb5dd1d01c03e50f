//! [`VocabWeight`]: a `[V, H]` vocabulary matrix (an input embedding, or an output head's
//! weights) as a model keeps it: a candle tensor, or packed rows on the host (a GGUF file's
//! quantized embedding, a tied head's blocks) looked up where they lie, with their exact
//! values, so a quantized embedding is never widened into an f32 copy beside its blocks.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::packed::PackedWeight;
use crate::error::{Error, Result};

/// A `[rows, cols]` vocabulary matrix: a tensor, or host-packed rows.
#[derive(Debug, Clone)]
pub enum VocabWeight {
    /// A candle tensor (any device and float dtype).
    Tensor(Tensor),
    /// Packed or quantized rows on the host; rows past the packed ones, up to `rows` (a padded
    /// vocabulary's), are zeros.
    Packed {
        /// The packed rows.
        weight: Arc<PackedWeight>,
        /// The logical row count (at least one; rows past `weight`'s are zeros).
        rows: usize,
    },
}

impl From<Tensor> for VocabWeight {
    fn from(t: Tensor) -> Self {
        Self::Tensor(t)
    }
}

impl VocabWeight {
    /// Packed rows, all of them logical.
    pub fn packed(weight: Arc<PackedWeight>) -> Self {
        let rows = weight.rows();
        Self::Packed { weight, rows }
    }

    /// `(rows, cols)`; `None` for a tensor that is not 2-D.
    pub fn dims(&self) -> Option<(usize, usize)> {
        match self {
            Self::Tensor(t) => match t.dims() {
                &[r, c] => Some((r, c)),
                _ => None,
            },
            Self::Packed { weight, rows } => Some((*rows, weight.cols())),
        }
    }

    /// The dtype its values are kept in (a packed one's: f32 for quantized blocks).
    pub fn dtype(&self) -> DType {
        match self {
            Self::Tensor(t) => t.dtype(),
            Self::Packed { weight, .. } => weight.dtype().candle(),
        }
    }

    /// The tensor, when a tensor.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Self::Tensor(t) => Some(t),
            Self::Packed { .. } => None,
        }
    }

    /// The packed rows, when packed.
    pub fn as_packed(&self) -> Option<&Arc<PackedWeight>> {
        match self {
            Self::Tensor(_) => None,
            Self::Packed { weight, .. } => Some(weight),
        }
    }

    /// The rows of `ids` (a 1-D `u32` tensor) as an f32 `[n, cols]` tensor on `ids`' device.
    /// Errors: `token-out-of-range` (named `what`) for an id of a packed matrix past its rows;
    /// candle's for a tensor's.
    pub fn lookup(&self, ids: &Tensor, what: &str) -> Result<Tensor> {
        match self {
            Self::Tensor(t) => super::f32_of(&t.index_select(ids, 0)?),
            Self::Packed { weight, rows } => {
                let device = ids.device().clone();
                let ids: Vec<u32> = ids.to_vec1()?;
                let cols = weight.cols();
                let mut out = vec![0.0f32; ids.len() * cols];
                for (&id, row) in ids.iter().zip(out.chunks_exact_mut(cols.max(1))) {
                    let o = id as usize;
                    if o >= *rows {
                        return Err(Error::TokenOutOfRange {
                            name: what.to_string(),
                            id: i64::from(id),
                            vocab_size: *rows,
                        });
                    }
                    if o < weight.rows() {
                        weight.row_into(o, row);
                    }
                }
                Ok(Tensor::from_vec(out, (ids.len(), cols), &device)?)
            }
        }
    }

    /// The matrix as a dense tensor on `device`: the tensor itself, or the packed rows' values
    /// (f32, rows past the stored ones zeros).
    pub fn into_dense(self, device: &Device) -> Result<Tensor> {
        match self {
            Self::Tensor(t) => Ok(t),
            Self::Packed { rows, .. } => self.dense(rows, device, DType::F32),
        }
    }

    /// The first `rows` rows as a dense matrix on `device` in `dtype` (rows past the stored
    /// ones zeros): the tensor itself when nothing changes, else a copy (a packed matrix's
    /// values unpacked).
    pub fn dense(&self, rows: usize, device: &Device, dtype: DType) -> Result<Tensor> {
        let (t, n) = match self {
            Self::Tensor(t) => (t.clone(), t.dims().first().copied().unwrap_or(0)),
            Self::Packed { weight, .. } => {
                let (n, cols) = (weight.rows(), weight.cols());
                let keep = n.min(rows);
                let mut values = vec![0.0f32; keep * cols];
                for (o, row) in values.chunks_exact_mut(cols.max(1)).enumerate() {
                    weight.row_into(o, row);
                }
                (Tensor::from_vec(values, (keep, cols), device)?, keep)
            }
        };
        let t = t.to_device(device)?.to_dtype(dtype)?;
        Ok(if n >= rows {
            t.narrow(0, 0, rows)?.contiguous()?
        } else {
            let cols = t.dims().get(1).copied().unwrap_or(0);
            let pad = Tensor::zeros((rows - n, cols), dtype, device)?;
            Tensor::cat(&[&t, &pad], 0)?.contiguous()?
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::nn::WeightDtype;
    use crate::nn::quant::Quant;
    use crate::test_values::values;
    use crate::view::Floats;

    /// Every packed and quantized kind of a `[rows, cols]` matrix.
    fn kinds(rows: usize, cols: usize) -> Vec<PackedWeight> {
        let w = values(rows * cols, 3);
        let floats = [WeightDtype::F32, WeightDtype::BF16, WeightDtype::F16]
            .map(|d| PackedWeight::pack(Floats::F32(&w), rows, cols, d).unwrap());
        let quants = [Quant::Q8_0, Quant::Q4K, Quant::Q6K]
            .map(|q| PackedWeight::quantize(Floats::F32(&w), rows, cols, q).unwrap());
        floats.into_iter().chain(quants).collect()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        v.into_iter().map(f32::to_bits).collect()
    }

    #[test]
    fn packed_rows_are_looked_up_with_their_exact_values() {
        let (rows, cols) = (19, 512);
        for w in kinds(rows, cols) {
            let values = Tensor::from_vec(w.unpack(), (rows, cols), &Device::Cpu).unwrap();
            let dense = VocabWeight::from(values);
            // Two padded rows past the stored ones, looked up as zeros.
            let packed = VocabWeight::Packed {
                weight: Arc::new(w.clone()),
                rows: rows + 2,
            };
            let at = format!("{:?} {:?}", w.dtype(), w.quant());
            assert_eq!(packed.dims(), Some((rows + 2, cols)), "{at}");
            let ids = Tensor::new(&[7u32, 0, 18, 7, 9], &Device::Cpu).unwrap();
            let want = bits(&dense.lookup(&ids, "ids").unwrap());
            assert_eq!(bits(&packed.lookup(&ids, "ids").unwrap()), want, "{at}");
            let pad = Tensor::new(&[rows as u32 + 1], &Device::Cpu).unwrap();
            let zeros = packed.lookup(&pad, "ids").unwrap();
            assert!(bits(&zeros).iter().all(|&b| b == 0), "{at}");
            let far = Tensor::new(&[rows as u32 + 2], &Device::Cpu).unwrap();
            let e = packed.lookup(&far, "ids").unwrap_err();
            assert_eq!(e.code(), "token-out-of-range", "{at}");
            // Dense copies: narrowed, and padded with zero rows.
            let f32s = DType::F32;
            let narrow = packed.dense(5, &Device::Cpu, f32s).unwrap();
            assert_eq!(
                bits(&narrow),
                bits(&dense.dense(5, &Device::Cpu, f32s).unwrap())
            );
            let wide = packed.clone().into_dense(&Device::Cpu).unwrap();
            assert_eq!(wide.dims(), [rows + 2, cols]);
            assert_eq!(
                bits(&wide.narrow(0, 0, rows).unwrap()),
                bits(&dense.as_tensor().unwrap().clone())
            );
        }
    }
}
