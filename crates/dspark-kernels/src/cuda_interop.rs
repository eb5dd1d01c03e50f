//! Sharing CUDA memory with other frameworks (torch through DLPack) without copies.
//!
//! - `cuda_device` (in [`crate::open`]): one candle [`Device`] per ordinal for the whole
//!   process, on the device's primary context (the one torch uses) with its own stream. Candle
//!   compares devices by an id minted per `Device::new_cuda` call, so every tensor of a call must
//!   come from that cache.
//! - [`BorrowedTensor`]: a candle tensor over memory another framework owns. Candle would free
//!   a wrapped allocation when the tensor drops; the guard swaps it out of the storage first and
//!   leaks the borrowed pointer, so the owner frees it (through its DLPack deleter), not us.
//! - [`stream_handle`], [`wait_for_stream`], [`signal_stream`]: the DLPack `stream` protocol.
//!   A consumer reading a producer's tensor first makes its stream wait on the producer's; a
//!   producer handing out a tensor makes the consumer's stream wait on its own.
//! - [`device_ptr`]: the address of a contiguous tensor, for exporting it.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, sys};
use candle_core::cuda_backend::{CudaStorage, CudaStorageSlice};
use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, DType, Device, InplaceOp1, Layout, Storage, Tensor};

use crate::error::{Error, Result};

fn cuda_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Candle(candle_core::Error::Cuda(format!("{what}: {e}").into()))
}

fn stream_of(device: &Device) -> Result<Arc<CudaStream>> {
    Ok(device.as_cuda_device()?.cuda_stream())
}

/// The raw `CUstream` of `device`'s stream, as the integer DLPack's `stream` argument takes.
pub fn stream_handle(device: &Device) -> Result<usize> {
    Ok(stream_of(device)?.cu_stream() as usize)
}

/// Make `device`'s stream wait for all work queued so far on `producer` (a raw `CUstream`;
/// DLPack's `1` is the legacy default stream, `2` the per-thread default stream).
pub fn wait_for_stream(device: &Device, producer: usize) -> Result<()> {
    foreign_join(device, producer, true)
}

/// Make the raw stream `consumer` wait for all work queued so far on `device`'s stream.
pub fn signal_stream(device: &Device, consumer: usize) -> Result<()> {
    foreign_join(device, consumer, false)
}

fn foreign_join(device: &Device, foreign: usize, ours_waits: bool) -> Result<()> {
    use candle_core::cuda::cudarc::driver::result;
    let ours = stream_of(device)?;
    let theirs = foreign as sys::CUstream;
    if theirs == ours.cu_stream() {
        return Ok(());
    }
    ours.context()
        .bind_to_thread()
        .map_err(|e| cuda_error("bind context", e))?;
    let event = ours
        .context()
        .new_event(None)
        .map_err(|e| cuda_error("create event", e))?;
    // SAFETY: `theirs` is a stream of this context handed to us by the other framework (or a
    // DLPack default-stream constant), `event` is a live event of the same context.
    unsafe {
        if ours_waits {
            result::event::record(event.cu_event(), theirs)
                .map_err(|e| cuda_error("record event", e))?;
            result::stream::wait_event(
                ours.cu_stream(),
                event.cu_event(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(|e| cuda_error("wait event", e))?;
        } else {
            event
                .record(&ours)
                .map_err(|e| cuda_error("record event", e))?;
            result::stream::wait_event(
                theirs,
                event.cu_event(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(|e| cuda_error("wait event", e))?;
        }
    }
    Ok(())
}

/// A candle tensor over CUDA memory owned elsewhere; see the module docs.
pub struct BorrowedTensor {
    tensor: Tensor,
}

impl BorrowedTensor {
    /// Wrap `numel` contiguous elements of `dtype` at `ptr` on `device` as a tensor of `shape`.
    ///
    /// # Safety
    /// `ptr` must point at a live allocation of the device's context holding at least
    /// `shape.elem_count()` elements of `dtype`, ready on `device`'s stream (see
    /// [`wait_for_stream`]), and stay alive and unwritten by others while this value lives.
    pub unsafe fn new(device: &Device, ptr: u64, dtype: DType, shape: &[usize]) -> Result<Self> {
        let cuda = device.as_cuda_device()?.clone();
        let stream = cuda.cuda_stream();
        let n: usize = shape.iter().product();
        macro_rules! wrap {
            ($t:ty, $v:ident) => {{
                // SAFETY: the caller guarantees the allocation (see above); the slice is leaked
                // before it can be freed (`Drop`).
                let s: CudaSlice<$t> = unsafe { stream.upgrade_device_ptr(ptr, n) };
                CudaStorageSlice::$v(s)
            }};
        }
        let slice = match dtype {
            DType::F32 => wrap!(f32, F32),
            DType::F16 => wrap!(half::f16, F16),
            DType::BF16 => wrap!(half::bf16, BF16),
            DType::I64 => wrap!(i64, I64),
            DType::I32 => wrap!(i32, I32),
            DType::U32 => wrap!(u32, U32),
            DType::U8 => wrap!(u8, U8),
            other => {
                return Err(Error::UnsupportedDtype {
                    name: "tensor".into(),
                    message: format!("{other:?} cannot be borrowed from another framework"),
                });
            }
        };
        let storage = Storage::Cuda(CudaStorage {
            slice,
            device: cuda,
        });
        Ok(Self {
            tensor: Tensor::from_storage(storage, shape, BackpropOp::none(), false),
        })
    }

    /// The tensor (valid while `self` lives; results computed from it own their memory).
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }
}

/// Swaps the borrowed slice out of the storage for a one-element allocation of ours and
/// leaks the borrowed pointer.
struct Release;

impl InplaceOp1 for Release {
    fn name(&self) -> &'static str {
        "dspark-release-borrowed"
    }

    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        Ok(())
    }

    fn cuda_fwd(&self, storage: &mut CudaStorage, _: &Layout) -> candle_core::Result<()> {
        let dev = storage.device.clone();
        macro_rules! swap {
            ($t:ty, $v:ident, $old:expr) => {{
                let fresh: CudaSlice<$t> = dev.alloc_zeros::<$t>(1)?;
                let old = std::mem::replace($old, fresh);
                let _ = old.leak();
            }};
        }
        match &mut storage.slice {
            CudaStorageSlice::F32(s) => swap!(f32, F32, s),
            CudaStorageSlice::F16(s) => swap!(half::f16, F16, s),
            CudaStorageSlice::BF16(s) => swap!(half::bf16, BF16, s),
            CudaStorageSlice::I64(s) => swap!(i64, I64, s),
            CudaStorageSlice::I32(s) => swap!(i32, I32, s),
            CudaStorageSlice::U32(s) => swap!(u32, U32, s),
            CudaStorageSlice::U8(s) => swap!(u8, U8, s),
            _ => candle_core::bail!("unexpected dtype in a borrowed tensor"),
        }
        Ok(())
    }
}

impl Drop for BorrowedTensor {
    fn drop(&mut self) {
        // Failing here would free memory we do not own: abort loudly instead of risking it.
        if let Err(e) = self.tensor.inplace_op1(&Release) {
            eprintln!("dspark: could not release a borrowed CUDA tensor ({e}); aborting");
            std::process::abort();
        }
    }
}

/// The device address of contiguous CUDA tensor `t`'s first element (with its layout offset).
///
/// The address stays valid while `t` (or a clone sharing its storage) lives.
pub fn device_ptr(t: &Tensor) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cs) = &*storage else {
        return Err(Error::invalid("tensor", "not a CUDA tensor"));
    };
    if !layout.is_contiguous() {
        return Err(Error::bad_shape("tensor", "not contiguous"));
    }
    let stream = cs.device.cuda_stream();
    let offset = layout.start_offset() * cs.dtype().size_in_bytes();
    macro_rules! base {
        ($s:expr) => {{
            let (p, _sync) = $s.device_ptr(&stream);
            p
        }};
    }
    let base = match &cs.slice {
        CudaStorageSlice::F32(s) => base!(s),
        CudaStorageSlice::F16(s) => base!(s),
        CudaStorageSlice::BF16(s) => base!(s),
        CudaStorageSlice::I64(s) => base!(s),
        CudaStorageSlice::I32(s) => base!(s),
        CudaStorageSlice::U32(s) => base!(s),
        CudaStorageSlice::U8(s) => base!(s),
        _ => return Err(Error::invalid("tensor", "unsupported dtype for export")),
    };
    Ok(base + offset as u64)
}
