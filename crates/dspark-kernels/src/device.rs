//! Where kernels run: the kernel path switch and what this build knows about devices.
//!
//! Every kernel and the drafter forward have up to three implementations:
//! - **fast**: the host slice kernels (`sampling`'s slice cores, the drafter's packed/fused
//!   layers), the reference;
//! - **tensor**: one device-generic path written with candle tensor operations that exist on
//!   every backend (plus custom ops where those are not enough): the drafter and the targets on
//!   a CUDA device, and the reference of the fused kernels on it;
//! - **fused**: the sampling kernels as a few fused CUDA launches each
//!   ([`crate::sampling::fused`]), what CUDA tensors take by default; on the CPU, their Rust
//!   models (the same arithmetic in the same order), with the models on the tensor path.
//!
//! Host tensors take the fast path unless `DSPARK_KERNEL_PATH` says `tensor` or `fused`, which
//! forces that path on the CPU: that is how the device code is tested on machines without a
//! GPU. On a CUDA device the sampling kernels run fused unless the variable says `tensor`.
//! The variable is read once per process; any value other than `fast`, `tensor`, `fused` or
//! empty is an `invalid-argument` error from the first kernel call (and from [`kernel_path`]).

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
    /// The device-generic candle-tensor path, forced on the CPU (and on CUDA devices, in place
    /// of the fused kernels).
    Tensor,
    /// The fused sampling kernels' Rust models on the CPU (the tensor path for the rest).
    Fused,
}

impl KernelPath {
    /// `"fast"`, `"tensor"` or `"fused"`.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelPath::Fast => "fast",
            KernelPath::Tensor => "tensor",
            KernelPath::Fused => "fused",
        }
    }

    /// Parse a value of [`KERNEL_PATH_ENV`] (`""` is [`KernelPath::Fast`]).
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim() {
            "" | "fast" => Ok(KernelPath::Fast),
            "tensor" => Ok(KernelPath::Tensor),
            "fused" => Ok(KernelPath::Fused),
            other => Err(Error::invalid(
                KERNEL_PATH_ENV,
                format!("{other:?}: expected \"fast\", \"tensor\" or \"fused\""),
            )),
        }
    }
}

fn from_env() -> std::result::Result<KernelPath, String> {
    match std::env::var(KERNEL_PATH_ENV) {
        Ok(v) => KernelPath::parse(&v).map_err(|e| e.to_string()),
        Err(std::env::VarError::NotPresent) => Ok(KernelPath::Fast),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!(
            "invalid `{KERNEL_PATH_ENV}`: not valid UTF-8 (expected \"fast\", \"tensor\" or \"fused\")"
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

/// `true` when kernels on `device` leave the host fast path: always off the CPU, and on the
/// CPU when [`kernel_path`] is [`KernelPath::Tensor`] or [`KernelPath::Fused`].
pub fn use_tensor_path(device: &Device) -> Result<bool> {
    Ok(!device.is_cpu() || kernel_path()? != KernelPath::Fast)
}

/// `true` when the sampling kernels on `device` run fused ([`crate::sampling::fused`]): on a
/// CUDA device unless [`kernel_path`] is [`KernelPath::Tensor`], on the CPU (their models) when
/// it is [`KernelPath::Fused`]; never on other devices.
pub fn use_fused(device: &Device) -> Result<bool> {
    let path = kernel_path()?;
    Ok(match device {
        Device::Cpu => path == KernelPath::Fused,
        Device::Cuda(_) => path != KernelPath::Tensor,
        _ => false,
    })
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

/// The variable that lets f32 products on a CUDA device run in TF32 (`1`; off by default).
pub const ALLOW_TF32_ENV: &str = "DSPARK_ALLOW_TF32";

/// Whether [`ALLOW_TF32_ENV`] is `1` (or `true`).
pub fn allow_tf32() -> bool {
    std::env::var(ALLOW_TF32_ENV).is_ok_and(|v| matches!(v.trim(), "1" | "true"))
}

/// Whether this build was compiled with the `cuda` feature.
pub const fn cuda_compiled() -> bool {
    cfg!(feature = "cuda")
}

/// Which build this is, for messages: "the CPU build of dspark 0.1.0 (no \`cuda\` feature)", or
/// "the CUDA build of dspark 0.1.0 (CUDA 13.0, PTX 9.0 for sm_90)".
pub fn build_description() -> String {
    let version = env!("CARGO_PKG_VERSION");
    #[cfg(feature = "cuda")]
    {
        format!(
            "the CUDA build of dspark {version} (CUDA {}, PTX {} for {})",
            cuda::version_string(cuda::BUILD_CUDA),
            cuda::ptx_field(".version"),
            cuda::ptx_field(".target"),
        )
    }
    #[cfg(not(feature = "cuda"))]
    {
        format!("the CPU build of dspark {version} (no `cuda` feature)")
    }
}

/// The number of CUDA devices this build can use here, or why there is none.
///
/// Without the `cuda` feature: always the reason that this is the CPU build. With it, the
/// driver is probed once per process (the result is kept): its library (`libcuda.so.1`, loaded
/// at run time, so a machine without a driver can still import the build and use the CPU),
/// `cuInit`, a driver at least as new as the CUDA major version this build was compiled for,
/// and the device count. Never panics.
pub fn cuda_status() -> std::result::Result<usize, String> {
    #[cfg(feature = "cuda")]
    {
        cuda::status()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(format!(
            "{} cannot use CUDA devices (install the CUDA wheel: README \"GPU build\")",
            build_description()
        ))
    }
}

/// Number of CUDA devices the driver reports (0 without the `cuda` feature, without a driver,
/// or with one too old for this build: [`cuda_error`] says which).
pub fn cuda_device_count() -> usize {
    cuda_status().unwrap_or(0)
}

/// Why [`cuda_device_count`] is 0 (`None` when there is at least one device), e.g.
/// `the NVIDIA driver (libcuda.so.1) was not found: ...`.
pub fn cuda_error() -> Option<String> {
    cuda_status().err()
}

/// The shared libraries (sonames) a CUDA build opens by name at run time besides the driver:
/// cuBLAS (and its cuBLASLt), cuRAND and NVRTC of the CUDA major version it was compiled for,
/// e.g. `libcublas.so.13`. A loader (the Python package's) makes them findable from NVIDIA's
/// wheels before first use. Empty without the `cuda` feature.
pub fn cuda_runtime_libraries() -> Vec<String> {
    #[cfg(feature = "cuda")]
    {
        cuda::runtime_libraries()
    }
    #[cfg(not(feature = "cuda"))]
    {
        Vec::new()
    }
}

/// The driver side of a CUDA build: everything is opened at run time and probed before use.
#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    use std::sync::OnceLock;

    use candle_core::Device;
    use candle_core::cuda::cudarc::driver::{DriverError, result, sys};
    use candle_core::cuda::cudarc::nvrtc::Ptx;

    /// The CUDA version this build was compiled for, as the driver API writes it (13000).
    pub(super) const BUILD_CUDA: u32 = sys::CUDA_VERSION;

    /// dspark's own PTX (built by the same nvcc as candle's kernels): probed at device
    /// creation, its header named in messages.
    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/mask.ptx"));

    /// `13000` -> `13.0`.
    pub(super) fn version_string(v: u32) -> String {
        format!("{}.{}", v / 1000, (v % 1000) / 10)
    }

    /// The value of a PTX header directive (`.version` -> `9.0`, `.target` -> `sm_90`).
    pub(super) fn ptx_field(key: &str) -> &'static str {
        PTX.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(key).filter(|rest| rest.starts_with(' ')))
            .and_then(|rest| rest.split_whitespace().next())
            .map_or("?", |v| v.trim_end_matches(','))
    }

    /// `CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)`.
    fn describe(e: DriverError) -> String {
        let name = e.error_name().map_or_else(
            |_| format!("CUresult {}", e.0 as u32),
            |n| n.to_string_lossy().into_owned(),
        );
        match e.error_string() {
            Ok(s) => format!("{name} ({})", s.to_string_lossy()),
            Err(_) => name,
        }
    }

    /// Open the first of `names` that loads; the error is that of the first name.
    fn open_any(names: &[String]) -> std::result::Result<libloading::Library, String> {
        let mut first = None;
        for n in names {
            // SAFETY: loading a CUDA library runs its initializers, which ask nothing of the
            // caller; the CUDA bindings open the same libraries by the same names.
            match unsafe { libloading::Library::new(n) } {
                Ok(lib) => return Ok(lib),
                Err(e) => {
                    // libloading's own text is "dlopen failed": the reason is its source.
                    let why = std::error::Error::source(&e)
                        .map_or_else(|| e.to_string(), |s| s.to_string());
                    first.get_or_insert(why);
                }
            }
        }
        Err(first.unwrap_or_else(|| "no library name to try".into()))
    }

    fn driver_version() -> std::result::Result<u32, String> {
        let mut v: std::ffi::c_int = 0;
        // SAFETY: `v` is a valid out-pointer for the duration of the call; the driver library
        // is loaded (checked by the caller).
        unsafe { sys::cuDriverGetVersion(&mut v) }
            .result()
            .map_err(|e| format!("cuDriverGetVersion failed: {}", describe(e)))?;
        Ok(u32::try_from(v).unwrap_or(0))
    }

    /// The driver probe behind [`super::cuda_status`], once per process.
    pub(super) fn status() -> std::result::Result<usize, String> {
        static STATUS: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
        STATUS.get_or_init(probe).clone()
    }

    fn probe() -> std::result::Result<usize, String> {
        static DRIVER: OnceLock<libloading::Library> = OnceLock::new();
        if DRIVER.get().is_none() {
            let names = ["libcuda.so.1".to_string(), "libcuda.so".to_string()];
            let lib = open_any(&names).map_err(|e| {
                format!("the NVIDIA driver (libcuda.so.1) was not found, so CUDA is off: {e}")
            })?;
            // Kept open for the process: the bindings open the same library by name.
            let _ = DRIVER.set(lib);
        }
        result::init().map_err(|e| format!("the driver did not initialize: {}", describe(e)))?;
        let driver = driver_version()?;
        if driver / 1000 < BUILD_CUDA / 1000 {
            return Err(format!(
                "the driver supports CUDA {}, older than the CUDA {} this build needs (a driver \
                 for CUDA {}.0 or newer)",
                version_string(driver),
                version_string(BUILD_CUDA),
                BUILD_CUDA / 1000
            ));
        }
        let n = result::device::get_count()
            .map_err(|e| format!("the driver could not count devices: {}", describe(e)))?;
        match usize::try_from(n) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err("the driver reports no CUDA device".into()),
        }
    }

    /// cuRAND's soname major is 10 from CUDA 11 to 13; the others follow the CUDA major.
    const CURAND_MAJOR: u32 = 10;

    pub(super) fn runtime_libraries() -> Vec<String> {
        let major = BUILD_CUDA / 1000;
        vec![
            format!("libcublasLt.so.{major}"),
            format!("libcublas.so.{major}"),
            format!("libcurand.so.{CURAND_MAJOR}"),
            format!("libnvrtc.so.{major}"),
        ]
    }

    /// cuBLAS and cuRAND, which a candle device opens when it is made (the bindings would
    /// panic on a missing one). Once both are found they stay open.
    pub(crate) fn runtime_libraries_present() -> std::result::Result<(), String> {
        static OPEN: OnceLock<Vec<libloading::Library>> = OnceLock::new();
        if OPEN.get().is_some() {
            return Ok(());
        }
        let major = BUILD_CUDA / 1000;
        let mut libs = Vec::new();
        for (stem, soname_major) in [("cublas", major), ("curand", CURAND_MAJOR)] {
            let names = [
                format!("lib{stem}.so.{soname_major}"),
                format!("lib{stem}.so"),
            ];
            let lib = open_any(&names).map_err(|e| {
                format!(
                    "{} was not found ({e}); install NVIDIA's CUDA {major} wheels \
                     (`pip install \"dspark[cuda]\"`, or torch built for CUDA {major}) and \
                     import dspark (it finds them in site-packages)",
                    names[0]
                )
            })?;
            libs.push(lib);
        }
        let _ = OPEN.set(libs);
        Ok(())
    }

    /// Load this build's PTX on `device`: a driver that refuses it (older than the PTX, or a
    /// GPU the PTX target cannot run on) is reported with its own message and both versions.
    pub(crate) fn check_ptx(device: &Device) -> std::result::Result<(), String> {
        let dev = device.as_cuda_device().map_err(|e| e.to_string())?;
        let context = dev.cuda_stream().context().clone();
        match context.load_module(Ptx::from_src(PTX)) {
            Ok(_) => Ok(()),
            Err(e) => {
                let driver = driver_version().map_or_else(|e| e, version_string);
                let cap = context
                    .compute_capability()
                    .map_or_else(|_| "?".into(), |(a, b)| format!("{a}.{b}"));
                Err(format!(
                    "the driver (CUDA {driver}, GPU compute capability {cap}) cannot load this \
                     build's PTX (.version {}, .target {}, from CUDA {}): {}",
                    ptx_field(".version"),
                    ptx_field(".target"),
                    version_string(BUILD_CUDA),
                    describe(e)
                ))
            }
        }
    }
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
    fn parses_the_three_paths_and_rejects_others() {
        assert_eq!(KernelPath::parse("").ok(), Some(KernelPath::Fast));
        assert_eq!(KernelPath::parse("fast").ok(), Some(KernelPath::Fast));
        assert_eq!(KernelPath::parse(" tensor ").ok(), Some(KernelPath::Tensor));
        assert_eq!(KernelPath::parse("fused").ok(), Some(KernelPath::Fused));
        assert_eq!(KernelPath::Fused.as_str(), "fused");
        let e = KernelPath::parse("gpu").err().map(|e| e.code());
        assert_eq!(e, Some("invalid-argument"));
        assert_eq!(KernelPath::Tensor.as_str(), "tensor");
    }

    #[test]
    fn cpu_tensors_follow_the_switch_and_mismatches_are_named() -> Result<()> {
        let forced = kernel_path()? != KernelPath::Fast;
        assert_eq!(use_tensor_path(&Device::Cpu)?, forced);
        assert_eq!(
            use_fused(&Device::Cpu)?,
            kernel_path()? == KernelPath::Fused
        );
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
    fn cuda_status_is_a_count_or_a_reason() {
        match cuda_status() {
            Ok(n) => assert!(n > 0 && cuda_error().is_none()),
            Err(why) => {
                assert!(!why.is_empty());
                assert_eq!(cuda_device_count(), 0);
                assert_eq!(cuda_error(), Some(why.clone()));
                if !cuda_compiled() {
                    assert!(why.contains("CPU build"), "{why}");
                }
            }
        }
        let description = build_description();
        assert!(description.contains(env!("CARGO_PKG_VERSION")));
        let libraries = cuda_runtime_libraries();
        if cuda_compiled() {
            assert!(description.contains("CUDA build") && !description.contains('?'));
            assert!(libraries.iter().any(|l| l.starts_with("libcublas.so.")));
        } else {
            assert!(description.contains("CPU build"));
            assert!(libraries.is_empty());
        }
    }
}
