//! PyO3 glue for dspark: conversions, error mapping and thin wrappers. No logic lives here.

mod args;
mod bridge;
mod bridge_drafter;
mod config;
mod dlpack;
mod drafter;
mod errors;
mod inspect;
mod json;
mod kernels;
mod native_target;
mod pair;
mod speculator;
mod vocab;

use pyo3::prelude::*;

/// The native half of the `dspark` package. Import `dspark`, not this module.
#[pymodule(gil_used = false)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    m.add_class::<config::PyDraftSpec>()?;
    m.add_class::<vocab::PyVocabLayout>()?;
    m.add_class::<vocab::PyIdMap>()?;
    m.add_class::<inspect::PyReport>()?;
    m.add_function(wrap_pyfunction!(inspect::inspect, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack::_dlpack_describe, m)?)?;
    m.add_function(wrap_pyfunction!(dlpack::_dlpack_sum, m)?)?;
    m.add_function(wrap_pyfunction!(errors::_test_panic, m)?)?;
    kernels::register(m)?;
    drafter::register(m)?;
    m.add_class::<native_target::PyNativeTarget>()?;
    m.add_class::<speculator::PySpeculator>()?;
    Ok(())
}
