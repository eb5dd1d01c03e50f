//! JSON values across the boundary (configs and reports are small: plain `json` module round trip).

use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::Value;

use crate::errors::value_error;

/// `serde_json::Value` → Python object via `json.loads`.
pub fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| value_error(e.to_string()))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// A Python dict → `serde_json::Value` via `json.dumps`.
pub fn from_py_dict(dict: &Bound<'_, PyDict>) -> PyResult<Value> {
    let text: String = dict
        .py()
        .import("json")?
        .call_method1("dumps", (dict,))?
        .extract()?;
    serde_json::from_str(&text)
        .map_err(|e| value_error(format!("config dict is not JSON-serializable: {e}")))
}
