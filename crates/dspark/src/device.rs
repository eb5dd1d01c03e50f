//! Where kernels run: the kernel path switch and what this build knows about devices.
//!
//! Every kernel and the drafter forward have two implementations:
//! - **fast**: the host slice kernels (`sampling`'s slice cores, the drafter's packed/fused
//!   layers), the reference;
//! - **tensor**: one device-generic path written with candle tensor operations that exist on
//!   every backend (plus custom ops where those are not enough). It is what runs for tensors on
//!   a CUDA device.
//!
//! Host tensors take the fast path unless `DSPARK_KERNEL_PATH=tensor` is set, which forces the
//! tensor path on the CPU; that is how the device code is tested on machines without a GPU.
//! The variable is read once per process; any value other than `fast`, `tensor` or empty is an
//! `invalid-argument` error from the first kernel call (and from [`kernel_path`]).

use std::sync::OnceLock;

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};

/// The environment variable that selects the kernel path for host tensors.
pub const KERNEL_PATH_ENV: &str = "DSPARK_KERNEL_PATH";

/// Which implementation kernels use for host tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelPath {
    /// The host slice kernels (default).
    Fast,
    /// The device-generic candle-tensor path, forced on the CPU.
    Tensor,
}

impl KernelPath {
    /// `"fast"` or `"tensor"`.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelPath::Fast => "fast",
            KernelPath::Tensor => "tensor",
        }
    }

    /// Parse a value of [`KERNEL_PATH_ENV`] (`""` is [`KernelPath::Fast`]).
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim() {
            "" | "fast" => Ok(KernelPath::Fast),
            "tensor" => Ok(KernelPath::Tensor),
            other => Err(Error::invalid(
                KERNEL_PATH_ENV,
                format!("{other:?}: expected \"fast\" or \"tensor\""),
            )),
        }
    }
}

fn from_env() -> std::result::Result<KernelPath, String> {
    match std::env::var(KERNEL_PATH_ENV) {
        Ok(v) => KernelPath::parse(&v).map_err(|e| e.to_string()),
        Err(std::env::VarError::NotPresent) => Ok(KernelPath::Fast),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!(
            "invalid `{KERNEL_PATH_ENV}`: not valid UTF-8 (expected \"fast\" or \"tensor\")"
        )),
    }
}

/// The kernel path for host tensors, from [`KERNEL_PATH_ENV`] (read once per process).
pub fn kernel_path() -> Result<KernelPath> {
    static PATH: OnceLock<std::result::Result<KernelPath, String>> = OnceLock::new();
    PATH.get_or_init(from_env)
        .clone()
        .map_err(|message| Error::invalid(KERNEL_PATH_ENV, message))
}

/// `true` when kernels on `device` take the tensor path: always off the CPU, and on the CPU
/// when [`kernel_path`] is [`KernelPath::Tensor`].
pub fn use_tensor_path(device: &Device) -> Result<bool> {
    Ok(!device.is_cpu() || kernel_path()? == KernelPath::Tensor)
}

/// `true` when the host fast kernels serve `device`: it is the CPU and [`kernel_path`] is
/// [`KernelPath::Fast`]. An invalid [`KERNEL_PATH_ENV`] counts as fast here: the kernels (and
/// the drafter's entry points) report it as an error.
pub fn fast_on(device: &Device) -> bool {
    device.is_cpu() && matches!(kernel_path(), Ok(KernelPath::Fast))
}

/// `true` when `t` may take the host fast path (the drafter's packed and fused CPU code): an
/// f32 tensor on the CPU with [`kernel_path`] [`KernelPath::Fast`] (see [`fast_on`]). Any other
/// tensor goes through candle operations that exist on every backend.
pub fn host_fast(t: &Tensor) -> bool {
    t.dtype() == candle_core::DType::F32 && fast_on(t.device())
}

/// Whether this build was compiled with the `cuda` feature.
pub const fn cuda_compiled() -> bool {
    cfg!(feature = "cuda")
}

/// Number of CUDA devices the driver reports (0 without the `cuda` feature or a driver).
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        candle_core::cuda::cudarc::driver::result::init()
            .and_then(|()| candle_core::cuda::cudarc::driver::result::device::get_count())
            .map_or(0, |n| usize::try_from(n).unwrap_or(0))
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

/// The device named `spec`: `cpu`, `cuda` (device 0) or `cuda:N`. Errors: `invalid-argument`
/// for any other name; `device-unavailable` for a CUDA device on a build without the `cuda`
/// feature, or one the driver does not have (`name` is the argument that asked for it).
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
    let unavailable = |message: String| Error::DeviceUnavailable {
        name: name.to_string(),
        device: format!("cuda:{ordinal}"),
        message,
    };
    if !cuda_compiled() {
        return Err(unavailable(
            "this build has no `cuda` feature (install the CUDA wheel: README \"GPU build\")"
                .into(),
        ));
    }
    let count = cuda_device_count();
    if ordinal >= count {
        return Err(unavailable(format!(
            "the driver reports {count} CUDA device(s)"
        )));
    }
    Device::new_cuda(ordinal).map_err(|e| unavailable(e.to_string()))
}

/// A short name of a device: `cpu`, `cuda:N` or `metal:N`.
pub fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// Check that every named tensor of one call is on `expected` (`device-mismatch` naming the
/// first one that is not).
pub fn same_device(expected: &Device, tensors: &[(&str, &Tensor)]) -> Result<()> {
    for (name, t) in tensors {
        if !t.device().same_device(expected) {
            return Err(Error::DeviceMismatch {
                name: (*name).to_string(),
                found: device_name(t.device()),
                expected: device_name(expected),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_two_paths_and_rejects_others() {
        assert_eq!(KernelPath::parse("").ok(), Some(KernelPath::Fast));
        assert_eq!(KernelPath::parse("fast").ok(), Some(KernelPath::Fast));
        assert_eq!(KernelPath::parse(" tensor ").ok(), Some(KernelPath::Tensor));
        let e = KernelPath::parse("gpu").err().map(|e| e.code());
        assert_eq!(e, Some("invalid-argument"));
        assert_eq!(KernelPath::Tensor.as_str(), "tensor");
    }

    #[test]
    fn cpu_tensors_follow_the_switch_and_mismatches_are_named() -> Result<()> {
        let forced = kernel_path()? == KernelPath::Tensor;
        assert_eq!(use_tensor_path(&Device::Cpu)?, forced);
        assert_eq!(fast_on(&Device::Cpu), !forced);
        let t = Tensor::zeros(3, candle_core::DType::F32, &Device::Cpu)?;
        same_device(&Device::Cpu, &[("a", &t), ("b", &t)])?;
        assert_eq!(host_fast(&t), !forced);
        assert!(!host_fast(&t.to_dtype(candle_core::DType::F16)?));
        assert_eq!(device_name(&Device::Cpu), "cpu");
        if !cuda_compiled() {
            assert_eq!(cuda_device_count(), 0);
        }
        Ok(())
    }

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
