//! JSON values across the boundary (configs and reports are small: plain `json` module round trip).

use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::Value;

use dspark::Error;

use crate::errors::{err, is_dspark};

/// `serde_json::Value` → Python object via `json.loads`.
pub fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value).map_err(|e| {
        err(Error::Internal {
            message: format!("a value did not serialize to JSON: {e}"),
        })
    })?;
    py.import("json")?.call_method1("loads", (text,))
}

/// A Python dict → `serde_json::Value` via `json.dumps(..., allow_nan=False)`.
///
/// A dict that is not plain JSON (NaN or ±inf, keys or values of other types, a cycle) is a
/// `ConfigError` (`bad-config`) naming `<dict>`, never a `ValueError`/`TypeError`.
pub fn from_py_dict(dict: &Bound<'_, PyDict>) -> PyResult<Value> {
    let py = dict.py();
    let bad = |message: String| err(Error::bad_config("<dict>", "<root>", message));
    let kwargs = PyDict::new(py);
    kwargs.set_item("allow_nan", false)?;
    let text = match py
        .import("json")?
        .call_method("dumps", (dict,), Some(&kwargs))
    {
        Ok(t) => t,
        Err(e) if is_dspark(py, &e) => return Err(e),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyException>(py) => {
            return Err(bad(format!(
                "the config dict is not plain JSON (NaN, infinity, or a value or key that \
                 is not a str, number, bool, None, list or dict): {}",
                e.value(py)
            )));
        }
        Err(e) => return Err(e),
    };
    let text: String = text.extract()?;
    serde_json::from_str(&text).map_err(|e| bad(format!("the config dict is not JSON: {e}")))
}
