//! `dspark._native.LIMITS`: the engine's documented size limits ([`dspark::limits`]), so the
//! Python front's argument readers bound values by the same numbers.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use dspark::limits;

/// Add `LIMITS` (name → value) to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let d = PyDict::new(m.py());
    for (name, value) in [
        ("MAX_OUTPUT_ELEMENTS", limits::MAX_OUTPUT_ELEMENTS),
        ("MAX_VOCAB", limits::MAX_VOCAB),
        ("MAX_LAYERS", limits::MAX_LAYERS),
        ("MAX_HIDDEN", limits::MAX_HIDDEN),
        ("MAX_HEADS", limits::MAX_HEADS),
        ("MAX_BLOCK", limits::MAX_BLOCK),
        ("MAX_BATCH", limits::MAX_BATCH),
        ("MAX_POSITION", limits::MAX_POSITION),
        ("MAX_CONFIG_BYTES", limits::MAX_CONFIG_BYTES),
        ("MAX_INDEX_BYTES", limits::MAX_INDEX_BYTES),
    ] {
        d.set_item(name, value)?;
    }
    m.add("LIMITS", d)
}
