//! `dspark.inspect` and its report.

use pyo3::prelude::*;

use crate::errors::guard;
use crate::{args, json};

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
    fn ok(&self) -> PyResult<bool> {
        guard(|| Ok(self.ok))
    }

    /// The stable JSON form as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        guard(|| json::to_py(py, &self.json))
    }

    /// The stable JSON form as a string.
    fn to_json(&self) -> PyResult<String> {
        guard(|| Ok(self.json.to_string()))
    }

    fn __repr__(&self) -> PyResult<String> {
        guard(|| {
            let errors = self
                .json
                .get("errors")
                .and_then(|e| e.as_array())
                .map_or(0, Vec::len);
            Ok(format!("Report(ok={}, errors={errors})", self.ok))
        })
    }
}

/// Inspect a drafter checkpoint against a target config without loading tensor data.
///
/// `draft` and `target` are paths (`str` or `os.PathLike`); anything else is an `InputError`
/// (`invalid-argument`). Problems with the files themselves are in the report, not raised.
/// `sts=False`: leave the calibration file (`sts.json`) out, for a load that does not read it.
#[pyfunction]
#[pyo3(signature = (draft, target = None, *, sts = None))]
pub fn inspect(
    py: Python<'_>,
    draft: &Bound<'_, PyAny>,
    target: Option<&Bound<'_, PyAny>>,
    sts: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyReport> {
    guard(|| {
        let draft = args::path(draft, "draft")?;
        let target = match target.filter(|t| !t.is_none()) {
            Some(t) => Some(args::path(t, "target")?),
            None => None,
        };
        let options = dspark::InspectOptions {
            calibration: match sts.filter(|s| !s.is_none()) {
                Some(s) => args::boolean(s, "sts")?,
                None => true,
            },
        };
        let report = py.detach(|| dspark::inspect_with(&draft, target.as_deref(), &options));
        Ok(PyReport {
            ok: report.ok(),
            json: report.to_json(),
        })
    })
}
