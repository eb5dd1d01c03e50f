//! Opening a device: a device name parsed ([`parse_device`]), and a CUDA device opened once
//! everything it needs is known to be there ([`open_cuda`]: the driver, the runtime libraries,
//! this build's PTX and the fused kernels), so a missing piece is a typed error instead of a
//! panic deep in the CUDA bindings. With the `cuda` feature, `cuda_device` keeps one device per
//! ordinal for the process (the one DLPack exchanges use).
//!
//! It stands above [`crate::device`] (what the build and the driver can do) and the kernels
//! whose loading it checks; `dspark::device` re-exports it with the rest of the device API.

use candle_core::Device;

#[cfg(feature = "cuda")]
use std::collections::HashMap;
#[cfg(feature = "cuda")]
use std::sync::Mutex;

#[cfg(feature = "cuda")]
use crate::device::{allow_tf32, cuda};
use crate::device::{build_description, cuda_compiled, cuda_status};
use crate::error::{Error, Result};

/// The candle device of CUDA ordinal `ordinal`, made by `make` (`Device::new_cuda` or
/// `Device::new_cuda_with_stream`) once everything it needs is known to be there, so that a
/// missing piece is a typed error instead of a panic deep in the CUDA bindings.
///
/// Errors (`device-unavailable`, naming `name` and `cuda:N`): a build without the `cuda`
/// feature (the message says which build this is); no usable driver or device (the reason of
/// [`crate::device::cuda_error`]); an ordinal past the devices the driver reports; cuBLAS or cuRAND not found;
/// the driver failing to create the device; the driver refusing this build's PTX (for example
/// a driver older than the PTX: its message, with the PTX and driver versions), or the fused
/// kernels' fatbins (a GPU older than sm_90: both named).
///
/// dspark's devices run everything on their one stream, so cudarc's multi-stream event
/// tracking (an event recorded and waited on for every allocation and kernel argument: about
/// 20 µs of host time per operation) is switched off; the only cross-stream orderings are the
/// explicit DLPack joins of `cuda_interop`.
pub fn open_cuda(
    name: &str,
    ordinal: usize,
    make: impl FnOnce(usize) -> candle_core::Result<Device>,
) -> Result<Device> {
    let unavailable = |message: String| Error::DeviceUnavailable {
        name: name.to_string(),
        device: format!("cuda:{ordinal}"),
        message,
    };
    if !cuda_compiled() {
        return Err(unavailable(format!(
            "this is {}: install the CUDA wheel (README \"GPU build\")",
            build_description()
        )));
    }
    let count = cuda_status().map_err(|why| {
        unavailable(format!(
            "this is {}, but no CUDA device can be used here: {why}",
            build_description()
        ))
    })?;
    if ordinal >= count {
        return Err(unavailable(format!(
            "the driver reports {count} CUDA device(s)"
        )));
    }
    #[cfg(feature = "cuda")]
    cuda::runtime_libraries_present().map_err(&unavailable)?;
    let device = make(ordinal).map_err(|e| unavailable(e.to_string()))?;
    #[cfg(feature = "cuda")]
    {
        let dev = device.as_cuda_device()?;
        // SAFETY: every tensor of this device is used on its stream alone: work queued on the
        // stream runs in order, frees are stream-ordered, and memory shared with another
        // framework's stream is joined explicitly (`cuda_interop::wait_for_stream` /
        // `signal_stream`) before either side uses it.
        unsafe { dev.disable_event_tracking() };
        // f32 products in TF32 only when asked, as torch's `allow_tf32` (bf16 / f16 products
        // accumulate in f32 either way).
        candle_core::cuda_backend::set_gemm_reduced_precision_f32(allow_tf32());
        cuda::check_ptx(&device).map_err(&unavailable)?;
        crate::sampling::fused::check_device(&device).map_err(|e| unavailable(e.to_string()))?;
    }
    Ok(device)
}

/// The device named `spec`: `cpu`, `cuda` (device 0) or `cuda:N`. Errors: `invalid-argument`
/// for any other name; `device-unavailable` for a CUDA device this build or machine cannot give
/// (see [`open_cuda`]; `name` is the argument that asked for it).
pub fn parse_device(name: &str, spec: &str) -> Result<Device> {
    let s = spec.trim().to_ascii_lowercase();
    let ordinal = match s.as_str() {
        "cpu" => return Ok(Device::Cpu),
        "cuda" => 0,
        _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => n,
            _ => {
                return Err(Error::invalid(
                    name,
                    format!("{spec:?}: expected \"cpu\", \"cuda\" or \"cuda:N\""),
                ));
            }
        },
    };
    open_cuda(name, ordinal, Device::new_cuda)
}

#[cfg(feature = "cuda")]
/// The process-wide candle device of CUDA ordinal `ordinal` (created on first use).
///
/// Errors: `device-unavailable` when the driver has no such device, or a piece it needs is
/// missing (see [`open_cuda`]).
pub fn cuda_device(ordinal: usize) -> Result<Device> {
    static DEVICES: Mutex<Option<HashMap<usize, Device>>> = Mutex::new(None);
    let mut guard = DEVICES
        .lock()
        .map_err(|_| Error::invalid("device", "the CUDA device cache was poisoned by a panic"))?;
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    let device = open_cuda("device", ordinal, Device::new_cuda_with_stream)?;
    map.insert(ordinal, device.clone());
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_or_fail_typed() -> Result<()> {
        assert!(parse_device("device", "cpu")?.is_cpu());
        assert!(parse_device("device", " CPU ")?.is_cpu());
        for bad in ["", "gpu", "cuda:", "cuda:-1", "cuda:x", "cpu:0", "metal"] {
            let e = parse_device("device", bad).err().map(|e| e.code());
            assert_eq!(e, Some("invalid-argument"), "{bad:?}");
        }
        // Without the feature (or past the driver's devices) CUDA is a typed refusal.
        let far = parse_device("device", "cuda:4096").err().map(|e| e.code());
        assert_eq!(far, Some("device-unavailable"));
        if !cuda_compiled() {
            let e = parse_device("device", "cuda").err().map(|e| e.to_string());
            assert!(e.is_some_and(|m| m.contains("no `cuda` feature")));
        }
        Ok(())
    }
}
