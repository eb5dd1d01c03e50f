//! PyO3 glue for dspark: conversions, error mapping and thin wrappers. No logic lives here.

mod args;
mod bridge;
#[cfg(feature = "cuda")]
mod bridge_device;
mod bridge_drafter;
mod build_info;
mod config;
mod dlpack;
mod drafter;
mod drafter_args;
mod engine;
mod errors;
mod grammar;
mod inspect;
mod interrupt;
mod json;
mod kernel_ids;
mod kernels;
#[cfg(feature = "cuda")]
mod kernels_device;
mod limits;
mod native_target;
mod pair;
mod serve;
mod speculator;
mod stats;
#[cfg(feature = "test-hooks")]
mod testing;
mod user;
mod vocab;

use pyo3::prelude::*;

/// The extension's Rust allocations go through mimalloc, as polars' wheels do: a step
/// allocates per-call buffers of megabytes (logits, prefill activations), and glibc's malloc
/// hands each back to the kernel and faults it in again on the next call (page faults and
/// zeroing were 30–60% of a 144-row product). Python's own allocations are untouched; memory
/// the extension lends to Python is freed by the extension.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The native half of the `dspark` package. Import `dspark`, not this module.
#[pymodule(gil_used = false)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    limits::register(m)?;
    m.add_class::<config::PyDraftSpec>()?;
    m.add_class::<vocab::PyVocabLayout>()?;
    m.add_class::<vocab::PyIdMap>()?;
    m.add_class::<inspect::PyReport>()?;
    m.add_function(wrap_pyfunction!(inspect::inspect, m)?)?;
    m.add_function(wrap_pyfunction!(native_target::gguf_side_files, m)?)?;
    m.add_function(wrap_pyfunction!(build_info::build_info, m)?)?;
    m.add_function(wrap_pyfunction!(build_info::_cuda_libraries, m)?)?;
    m.add_function(wrap_pyfunction!(serve::serve, m)?)?;
    #[cfg(feature = "test-hooks")]
    testing::register(m)?;
    kernels::register(m)?;
    drafter::register(m)?;
    m.add_class::<native_target::PyNativeTarget>()?;
    m.add_class::<speculator::PySpeculator>()?;
    m.add_class::<engine::PyEngine>()?;
    m.add_class::<engine::PyRequestUpdate>()?;
    m.add_class::<stats::PyStats>()?;
    Ok(())
}
