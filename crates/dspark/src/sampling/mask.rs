//! Masking of padded vocabulary columns: last-dim columns `[valid, V)` become `-inf`.
//!
//! A draft head padded above the target vocabulary (`V_d > V_t`) must never emit an id `>= V_t`.
//! [`mask_padded_rows`] is the tensor front (a candle [`CustomOp1`], so a device kernel can slot
//! in later); [`mask_padded_slice`] is the in-place slice core.

use crate::error::{Error, Result};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Device, Layout, Shape, Tensor};
use half::{bf16, f16};
use rayon::prelude::*;

/// Set columns `[valid, cols)` of every row of a row-major `[rows, cols]` buffer to `-inf`.
pub fn mask_padded_slice(data: &mut [f32], cols: usize, valid: usize) -> Result<()> {
    check(data.len(), cols, valid)?;
    fill_tail(data, cols, valid, f32::NEG_INFINITY);
    Ok(())
}

fn check(len: usize, cols: usize, valid: usize) -> Result<()> {
    if cols == 0 || !len.is_multiple_of(cols) {
        return Err(Error::bad_shape(
            "logits",
            format!("{len} values do not form rows of {cols} columns"),
        ));
    }
    if valid > cols {
        return Err(Error::invalid(
            "valid",
            format!("{valid} valid columns but rows have only {cols}"),
        ));
    }
    Ok(())
}

fn fill_tail<T: Copy + Send + Sync>(data: &mut [T], cols: usize, valid: usize, v: T) {
    if valid < cols {
        data.par_chunks_mut(cols)
            .for_each(|row| row[valid..].fill(v));
    }
}

/// The masking op (CPU; CUDA reports that it is not implemented yet).
#[derive(Debug, Clone, Copy)]
pub struct MaskPadded {
    /// Number of leading columns to keep.
    pub valid: usize,
}

impl MaskPadded {
    fn masked<T: Copy + Send + Sync>(&self, src: &[T], cols: usize, neg_inf: T) -> Vec<T> {
        let mut out = src.to_vec();
        fill_tail(&mut out, cols, self.valid, neg_inf);
        out
    }
}

impl CustomOp1 for MaskPadded {
    fn name(&self) -> &'static str {
        "dspark-mask-padded-rows"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::msg("mask_padded_rows: the input must be contiguous")
        })?;
        let cols = layout.dims().last().copied().unwrap_or(1);
        check(end - start, cols, self.valid).map_err(candle_core::Error::wrap)?;
        let out = match storage {
            CpuStorage::F32(v) => {
                CpuStorage::F32(self.masked(&v[start..end], cols, f32::NEG_INFINITY))
            }
            CpuStorage::F64(v) => {
                CpuStorage::F64(self.masked(&v[start..end], cols, f64::NEG_INFINITY))
            }
            CpuStorage::F16(v) => {
                CpuStorage::F16(self.masked(&v[start..end], cols, f16::NEG_INFINITY))
            }
            CpuStorage::BF16(v) => {
                CpuStorage::BF16(self.masked(&v[start..end], cols, bf16::NEG_INFINITY))
            }
            other => {
                return Err(candle_core::Error::msg(format!(
                    "mask_padded_rows: unsupported dtype {:?} (need f32, f64, f16 or bf16)",
                    other.dtype()
                )));
            }
        };
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _storage: &candle_core::CudaStorage,
        _layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        Err(candle_core::Error::Cuda(
            "dspark mask_padded_rows is not yet implemented on CUDA (the Tensor front \
             `mask_padded_rows` moves the data through the CPU)"
                .into(),
        ))
    }
}

/// Return `logits` with last-dim columns `[valid, V)` set to `-inf` (f32/f64/f16/bf16, any rank
/// >= 1). Tensors on other devices are moved through the CPU and back.
pub fn mask_padded_rows(logits: &Tensor, valid: usize) -> Result<Tensor> {
    let Some(&cols) = logits.dims().last() else {
        return Err(Error::bad_shape(
            "logits",
            "a scalar has no vocabulary dimension",
        ));
    };
    if valid > cols {
        return Err(Error::invalid(
            "valid",
            format!("{valid} valid columns but the last dim is {cols}"),
        ));
    }
    let op = MaskPadded { valid };
    if logits.device().is_cpu() {
        Ok(logits.contiguous()?.apply_op1_no_bwd(&op)?)
    } else {
        let cpu = logits.to_device(&Device::Cpu)?.contiguous()?;
        Ok(cpu.apply_op1_no_bwd(&op)?.to_device(logits.device())?)
    }
}
