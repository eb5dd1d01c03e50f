//! `dspark.build_info()`: what this build of the extension can do.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{err, guard};

/// `{"version", "cuda", "cuda_devices", "cuda_error", "kernel_path", "cpu_kernel",
/// "quant_kernel"}`: the package version,
/// whether the extension was compiled with CUDA, how many CUDA devices it can use here (0
/// without CUDA, without a driver, or with a driver too old for the build), why that number is
/// 0 (`None` when it is not; e.g. the driver library was not found), and the kernel path host
/// tensors take (`"fast"`, or `"tensor"` when `DSPARK_KERNEL_PATH` forces the device-generic
/// path), and the register kernel of the CPU's packed products (`"amx-bf16"`, `"avx512-bf16"`,
/// `"avx512"`, `"avx2"` or `"portable"`: every one but AMX gives the same bits, and AMX rounds
/// bf16 sums its own way) and of its quantized products
/// (`"amx-int8"`, `"avx512vnni"`, `"avxvnni"`, `"avx2"` or `"portable"`, the same bits too). An invalid
/// `DSPARK_KERNEL_PATH` raises `InputError` (code `invalid-argument`).
#[pyfunction]
pub fn build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    guard(|| {
        let path = dspark::device::kernel_path().map_err(err)?;
        let status = dspark::device::cuda_status();
        let d = PyDict::new(py);
        d.set_item("version", env!("CARGO_PKG_VERSION"))?;
        d.set_item("cuda", dspark::device::cuda_compiled())?;
        d.set_item("cuda_devices", status.as_ref().map_or(0, |n| *n))?;
        d.set_item("cuda_error", status.err())?;
        d.set_item("kernel_path", path.as_str())?;
        d.set_item("cpu_kernel", dspark::nn::packed::Kernel::best().name())?;
        d.set_item(
            "quant_kernel",
            dspark::nn::quant::QuantKernel::best().name(),
        )?;
        Ok(d)
    })
}

/// `_cuda_libraries()`: the sonames a CUDA build opens by name at run time besides the driver
/// (`libcublas.so.13`, ...; empty for the CPU build), for the package's loader.
#[pyfunction]
pub fn _cuda_libraries() -> Vec<String> {
    dspark::device::cuda_runtime_libraries()
}
