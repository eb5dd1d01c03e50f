//! `dspark.build_info()`: what this build of the extension can do.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{err, guard};

/// `{"version", "cuda", "cuda_devices", "kernel_path"}`: the package version, whether the
/// extension was compiled with CUDA, how many CUDA devices the driver reports (0 without CUDA),
/// and the kernel path host tensors take (`"fast"`, or `"tensor"` when `DSPARK_KERNEL_PATH`
/// forces the device-generic path). An invalid `DSPARK_KERNEL_PATH` raises `InputError`
/// (code `invalid-argument`).
#[pyfunction]
pub fn build_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    guard(|| {
        let path = dspark::device::kernel_path().map_err(err)?;
        let d = PyDict::new(py);
        d.set_item("version", env!("CARGO_PKG_VERSION"))?;
        d.set_item("cuda", dspark::device::cuda_compiled())?;
        d.set_item("cuda_devices", dspark::device::cuda_device_count())?;
        d.set_item("kernel_path", path.as_str())?;
        Ok(d)
    })
}
