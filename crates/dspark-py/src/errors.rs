//! The Python exception hierarchy, mapped from `dspark::Error` in one place.
//!
//! `DSparkError` is the base; each `ErrorKind` has a subclass. Every raised exception carries
//! `.code` (the engine's stable code) and `.problems` (a list of `(code, message)` pairs, one per
//! problem, so `Error::Multiple` loses nothing).

use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;

use dspark::{Error, ErrorKind};

pyo3::create_exception!(
    dspark._native,
    DSparkError,
    PyException,
    "Base class of every dspark error; `.code` is a stable machine code."
);
pyo3::create_exception!(
    dspark._native,
    ConfigError,
    DSparkError,
    "A config.json is malformed or contradicts itself."
);
pyo3::create_exception!(
    dspark._native,
    CheckpointError,
    DSparkError,
    "A checkpoint is missing, unreadable, or does not match its config."
);
pyo3::create_exception!(
    dspark._native,
    VocabError,
    DSparkError,
    "Vocabulary sizes or the draft-to-target id map are inconsistent."
);
pyo3::create_exception!(
    dspark._native,
    InputError,
    DSparkError,
    "An argument has an invalid shape, dtype, range or value."
);
pyo3::create_exception!(
    dspark._native,
    BackendError,
    DSparkError,
    "The tensor backend failed."
);

/// Newtype so `?` converts engine errors into Python exceptions (orphan rule).
#[derive(Debug)]
pub struct PyDSparkError(pub Error);

impl From<Error> for PyDSparkError {
    fn from(e: Error) -> Self {
        Self(e)
    }
}

impl From<PyDSparkError> for PyErr {
    fn from(e: PyDSparkError) -> Self {
        to_pyerr(&e.0)
    }
}

/// Convert an engine error into the matching Python exception, with `.code` and `.problems`.
pub fn to_pyerr(e: &Error) -> PyErr {
    let message = e.to_string();
    let err = match e.kind() {
        ErrorKind::Config => ConfigError::new_err(message),
        ErrorKind::Checkpoint => CheckpointError::new_err(message),
        ErrorKind::Vocab => VocabError::new_err(message),
        ErrorKind::Input => InputError::new_err(message),
        ErrorKind::Backend => BackendError::new_err(message),
    };
    Python::attach(|py| {
        let value = err.value(py);
        let problems: Vec<(String, String)> = e
            .problems()
            .iter()
            .map(|p| (p.code().to_string(), p.to_string()))
            .collect();
        // Setting attributes on a fresh exception instance cannot fail in practice; if it
        // does, the exception still carries its message.
        let _ = value.setattr("code", e.code());
        if let Ok(list) = PyList::new(py, problems) {
            let _ = value.setattr("problems", list);
        }
    });
    err
}

/// A plain `ValueError` for binding-level argument problems that never reach the engine.
pub fn value_error(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

/// Register the exception classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("DSparkError", py.get_type::<DSparkError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointError>())?;
    m.add("VocabError", py.get_type::<VocabError>())?;
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("BackendError", py.get_type::<BackendError>())?;
    Ok(())
}
