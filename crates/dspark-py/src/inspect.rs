//! `dspark.inspect` and its report.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::json;

/// What `inspect` found: `.ok`, `.to_dict()` (the stable JSON form).
#[pyclass(name = "Report", module = "dspark", frozen)]
pub struct PyReport {
    json: serde_json::Value,
    ok: bool,
}

#[pymethods]
impl PyReport {
    /// True when the drafter will load.
    #[getter]
    fn ok(&self) -> bool {
        self.ok
    }

    /// The stable JSON form as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json::to_py(py, &self.json)
    }

    /// The stable JSON form as a string.
    fn to_json(&self) -> String {
        self.json.to_string()
    }

    fn __repr__(&self) -> String {
        let errors = self
            .json
            .get("errors")
            .and_then(|e| e.as_array())
            .map_or(0, Vec::len);
        format!("Report(ok={}, errors={errors})", self.ok)
    }
}

/// Inspect a drafter checkpoint against a target config without loading tensor data.
#[pyfunction]
#[pyo3(signature = (draft, target = None))]
pub fn inspect(py: Python<'_>, draft: PathBuf, target: Option<PathBuf>) -> PyReport {
    let report = py.detach(|| dspark::inspect(&draft, target.as_deref()));
    PyReport {
        ok: report.ok(),
        json: report.to_json(),
    }
}
