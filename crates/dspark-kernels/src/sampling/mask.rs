//! Masking of padded vocabulary columns: last-dim columns `[valid, V)` become `-inf`.
//!
//! A draft head padded above the target vocabulary (`V_d > V_t`) must never emit an id `>= V_t`.
//! [`mask_padded_rows`] is the tensor front (a candle [`CustomOp1`]: a slice loop on the CPU, the
//! `kernels/mask.cu` PTX kernel on CUDA); [`mask_padded_slice`] is the in-place slice core. The
//! CPU body is the oracle of the CUDA one.

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

/// The masking op: CPU slice loop, or (with the `cuda` feature) one PTX kernel launch.
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
            _ => {
                return Err(candle_core::Error::msg(format!(
                    "mask_padded_rows: unsupported dtype {:?} (need f32, f64, f16 or bf16)",
                    storage.dtype()
                )));
            }
        };
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::msg("mask_padded_rows: the input must be contiguous")
        })?;
        let cols = layout.dims().last().copied().unwrap_or(1);
        check(end - start, cols, self.valid).map_err(candle_core::Error::wrap)?;
        let slice = cuda::mask(storage, start, end - start, cols, self.valid)?;
        Ok((
            candle_core::CudaStorage {
                slice,
                device: storage.device.clone(),
            },
            layout.shape().clone(),
        ))
    }
}

/// The CUDA body of [`MaskPadded`]: one grid-stride launch of `kernels/mask.cu`, which copies
/// values or writes the `-inf` bit pattern, so one kernel per element width serves every dtype.
#[cfg(feature = "cuda")]
mod cuda {
    use super::super::cuda_ptx::{BLOCK, MASK, grid_stride};
    use candle_core::CudaDevice;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
    use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};

    /// `-inf` bit patterns: f16, bf16, f32, f64.
    const NEG_INF_F16: u16 = 0xFC00;
    const NEG_INF_BF16: u16 = 0xFF80;
    const NEG_INF_F32: u32 = 0xFF80_0000;
    const NEG_INF_F64: u64 = 0xFFF0_0000_0000_0000;

    /// Mask `n` contiguous elements from `start` of `storage` (rows of `cols`, keep `valid`).
    pub(super) fn mask(
        storage: &candle_core::CudaStorage,
        start: usize,
        n: usize,
        cols: usize,
        valid: usize,
    ) -> candle_core::Result<CudaStorageSlice> {
        let dev = &storage.device;
        let k = Kernel {
            dev,
            start,
            n,
            cols,
            valid,
        };
        Ok(match &storage.slice {
            CudaStorageSlice::F32(s) => {
                CudaStorageSlice::F32(k.run(s, "dspark_mask_padded_b32", NEG_INF_F32)?)
            }
            CudaStorageSlice::F64(s) => {
                CudaStorageSlice::F64(k.run(s, "dspark_mask_padded_b64", NEG_INF_F64)?)
            }
            CudaStorageSlice::F16(s) => {
                CudaStorageSlice::F16(k.run(s, "dspark_mask_padded_b16", NEG_INF_F16)?)
            }
            CudaStorageSlice::BF16(s) => {
                CudaStorageSlice::BF16(k.run(s, "dspark_mask_padded_b16", NEG_INF_BF16)?)
            }
            _ => {
                return Err(candle_core::Error::msg(format!(
                    "mask_padded_rows: unsupported dtype {:?} (need f32, f64, f16 or bf16)",
                    storage.dtype()
                )));
            }
        })
    }

    struct Kernel<'a> {
        dev: &'a CudaDevice,
        start: usize,
        n: usize,
        cols: usize,
        valid: usize,
    }

    impl Kernel<'_> {
        /// Launch `name` over `src[start..start + n]` into a new buffer; `neg_inf` is the
        /// `-inf` bit pattern of `T`, of `T`'s width.
        fn run<T: DeviceRepr, B: DeviceRepr>(
            &self,
            src: &CudaSlice<T>,
            name: &str,
            neg_inf: B,
        ) -> candle_core::Result<CudaSlice<T>> {
            debug_assert_eq!(size_of::<T>(), size_of::<B>());
            // SAFETY: the kernel writes every one of the `n` elements before anyone reads them.
            let mut out = unsafe { self.dev.alloc::<T>(self.n)? };
            let Some(cfg) = grid_stride(self.n, BLOCK as usize) else {
                return Ok(out);
            };
            let func = MASK.func(self.dev, name)?;
            let stream = self.dev.cuda_stream();
            let src = src.slice(self.start..self.start + self.n);
            let mut args = stream.launch_builder(&func);
            args.arg(&self.n)
                .arg(&self.cols)
                .arg(&self.valid)
                .arg(&neg_inf)
                .arg(&src)
                .arg(&mut out);
            // SAFETY: the arguments match the kernel's signature
            // `(size_t n, size_t cols, size_t valid, T neg_inf, const T *src, T *dst)`, and
            // `src`/`out` hold `n` elements of `T`'s width.
            unsafe { args.launch(cfg) }.w()?;
            Ok(out)
        }
    }
}

/// Return `logits` with last-dim columns `[valid, V)` set to `-inf` (f32/f64/f16/bf16, rank at
/// least 1). CPU and CUDA tensors stay where they are; tensors on other devices are moved
/// through the CPU and back.
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
    if logits.device().is_cpu() || logits.device().is_cuda() {
        Ok(logits.contiguous()?.apply_op1_no_bwd(&op)?)
    } else {
        let cpu = logits.to_device(&Device::Cpu)?.contiguous()?;
        Ok(cpu.apply_op1_no_bwd(&op)?.to_device(logits.device())?)
    }
}

#[cfg(all(test, feature = "cuda"))]
mod cuda_tests {
    use super::*;
    use candle_core::DType;

    /// On a machine with a GPU (the binary needs a driver to load at all): the PTX kernel
    /// against the CPU body (the oracle), every dtype, bit for bit.
    #[test]
    fn cuda_matches_cpu() -> Result<()> {
        let Ok(gpu) = Device::new_cuda(0) else {
            return Ok(());
        };
        let (rows, cols) = (5, 1031);
        let vals: Vec<f32> = (0..rows * cols).map(|i| (i % 97) as f32 - 48.0).collect();
        let base = Tensor::from_vec(vals, (rows, cols), &Device::Cpu)?;
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for valid in [0, 1, 1000, cols] {
                let t = base.to_dtype(dtype)?;
                let want = mask_padded_rows(&t, valid)?.to_dtype(DType::F64)?;
                let got = mask_padded_rows(&t.to_device(&gpu)?, valid)?;
                assert!(got.device().is_cuda());
                let got = got.to_dtype(DType::F64)?.to_device(&Device::Cpu)?;
                let (g, w) = (got.to_vec2::<f64>()?, want.to_vec2::<f64>()?);
                assert_eq!(g, w, "{dtype:?}, valid {valid}");
            }
        }
        Ok(())
    }
}
