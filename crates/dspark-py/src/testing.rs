//! Test hooks, compiled only with the `test-hooks` feature (the test build of the wheel; release
//! wheels do not have them): the DLPack layer as the consumer sees it, and a panic inside the
//! boundary guard.

use pyo3::prelude::*;

use crate::dlpack::DlTensor;
use crate::errors::guard;

/// `_dlpack_describe(obj) -> (dtype, shape, device, data_ptr)`: what the consumer sees.
///
/// Kept for tests of the DLPack layer (zero-copy: `data_ptr` equals the producer's pointer).
#[pyfunction]
pub fn _dlpack_describe(obj: &Bound<'_, PyAny>) -> PyResult<(String, Vec<usize>, String, usize)> {
    guard(|| {
        let t = DlTensor::from_py(obj, "obj")?;
        Ok((
            t.dtype().name().to_string(),
            t.shape().to_vec(),
            "cpu".to_string(),
            t.data_ptr(),
        ))
    })
}

/// `_dlpack_sum(obj) -> float`: sum of a float tensor read through the borrowed slice (f32
/// accumulation), with the GIL released. Kept for tests of the DLPack layer.
#[pyfunction]
pub fn _dlpack_sum(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<f64> {
    guard(|| dlpack_sum(py, obj))
}

fn dlpack_sum(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<f64> {
    let t = DlTensor::from_py(obj, "obj")?;
    let total = if let Some(s) = t.slice::<f32>() {
        py.detach(|| s.iter().map(|&x| f64::from(x)).sum())
    } else if let Some(s) = t.slice::<half::f16>() {
        py.detach(|| s.iter().map(|&x| f64::from(x)).sum())
    } else if let Some(s) = t.slice::<half::bf16>() {
        py.detach(|| s.iter().map(|&x| f64::from(x)).sum())
    } else if let Some(s) = t.slice::<i64>() {
        py.detach(|| s.iter().map(|&x| x as f64).sum())
    } else if let Some(s) = t.slice::<i32>() {
        py.detach(|| s.iter().map(|&x| f64::from(x)).sum())
    } else if let Some(s) = t.slice::<u32>() {
        py.detach(|| s.iter().map(|&x| f64::from(x)).sum())
    } else {
        0.0
    };
    Ok(total)
}

/// `_test_panic(message)`: panics inside the guard. Kept for the tests of the panic boundary.
#[pyfunction]
pub fn _test_panic(message: &str) -> PyResult<()> {
    guard(|| panic!("{message}"))
}

/// Register the hooks on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_dlpack_describe, m)?)?;
    m.add_function(wrap_pyfunction!(_dlpack_sum, m)?)?;
    m.add_function(wrap_pyfunction!(_test_panic, m)?)?;
    Ok(())
}
