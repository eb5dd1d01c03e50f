//! The Python exception hierarchy, mapped from `dspark::Error` in one place.
//!
//! `DSparkError` is the base; each `ErrorKind` has a subclass. Every raised exception carries
//! `.code` (the engine's stable code) and `.problems` (a list of `(code, message)` pairs, one per
//! problem, so `Error::Multiple` loses nothing).

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

use pyo3::exceptions::PyException;
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
pyo3::create_exception!(
    dspark._native,
    InternalError,
    DSparkError,
    "A bug in dspark (a caught panic); code `internal`. Never the caller's fault."
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
        err(e.0)
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
        ErrorKind::Internal => InternalError::new_err(message),
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

/// An engine error as a Python exception (the `?`-free spelling of [`PyDSparkError`]). A
/// [`Error::Callback`] whose source is a Python exception (raised by a user's target, drafter
/// or hook while the engine called it) is that exception, unchanged.
pub fn err(e: Error) -> PyErr {
    match e {
        Error::Callback { context, source } => match source.downcast::<PyErr>() {
            Ok(original) => *original,
            Err(source) => to_pyerr(&Error::Callback { context, source }),
        },
        e => to_pyerr(&e),
    }
}

/// A Python exception raised by user code the engine called (`context`: which call, e.g.
/// `target.forward`), as the engine's [`Error::Callback`]; [`err`] hands the exception back
/// unchanged when it reaches Python again.
pub fn callback_error(context: &str, e: PyErr) -> Error {
    Error::callback(context, e)
}

/// Run the body of a Python entry point, turning a panic into `InternalError` (code `internal`).
///
/// Every `#[pyfunction]` and `#[pymethods]` body goes through here, so no `PanicException` (a
/// `BaseException` that `except Exception` does not catch) ever reaches a user. Panics inside
/// `py.detach` unwind through it too: PyO3 re-attaches the thread on the way out.
pub fn guard<T>(body: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(payload) => Err(err(Error::Internal {
            message: panic_message(payload.as_ref()),
        })),
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Whether `e` is already one of dspark's own exceptions.
pub fn is_dspark(py: Python<'_>, e: &PyErr) -> bool {
    e.is_instance_of::<DSparkError>(py)
}

/// Re-type a Python exception raised while reading argument `name` (an `__dlpack__`, `__index__`
/// or `__float__` that failed) as `InputError` (`invalid-argument`), keeping dspark's own
/// exceptions and anything that is not an `Exception` (`KeyboardInterrupt`, `SystemExit`) as is.
pub fn retype(py: Python<'_>, e: PyErr, name: &str, what: &str) -> PyErr {
    if is_dspark(py, &e) || !e.is_instance_of::<PyException>(py) {
        return e;
    }
    let kind = e
        .get_type(py)
        .name()
        .map_or_else(|_| "error".to_string(), |n| n.to_string());
    err(Error::invalid(
        name,
        format!("{what} ({kind}: {})", e.value(py)),
    ))
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
    m.add("InternalError", py.get_type::<InternalError>())?;
    Ok(())
}
