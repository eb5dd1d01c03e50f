//! Typed reading of Python arguments: the glue half of the boundary rule.
//!
//! Every user value that is not a tensor arrives as a Python object and is read here, so a bad
//! value is an `InputError` that names the argument, never an `OverflowError`, `TypeError` or
//! `ValueError` from a conversion:
//! - integers: `int`, numpy integers or anything with `__index__`; never `bool` or `float`
//!   (`invalid-argument`); negative where a count or id is meant (`invalid-argument`); above
//!   the argument's limit or beyond u64 (`too-large`, the limits of [`dspark::limits`]);
//! - floats: `int`, `float` or anything with `__float__`; never `bool` or `str`;
//! - ids (token ids, offsets, stop ids): a list/tuple of ints or a DLPack integer tensor,
//!   *copied once* into an owned vector, then validated and used (so a buffer another thread
//!   changes after the check can never be read again);
//! - paths and strings.

use std::path::PathBuf;

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyInt, PyList, PyString, PyTuple};

use dspark::Error;
use dspark::sampling::PerRequest;

use crate::dlpack::DlTensor;
use crate::errors::err;

/// `type(obj).__name__`, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "object".to_string(), |n| n.to_string())
}

fn is_bool(obj: &Bound<'_, PyAny>) -> bool {
    // Python's bool and numpy's `bool_` (which has no `__index__` on recent numpy anyway).
    obj.is_instance_of::<PyBool>() || matches!(type_name(obj).as_str(), "bool_" | "bool")
}

/// A list or tuple (a per-request sequence).
pub fn is_sequence(obj: &Bound<'_, PyAny>) -> bool {
    obj.cast::<PyList>().is_ok() || obj.cast::<PyTuple>().is_ok()
}

/// `obj` as a Python `int` (through `__index__`), refusing `bool` and everything else.
fn index<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyInt>> {
    let py = obj.py();
    let not_int = || {
        err(Error::invalid(
            name,
            format!("expected an integer, got {}", type_name(obj)),
        ))
    };
    if is_bool(obj) {
        return Err(not_int());
    }
    if let Ok(i) = obj.cast::<PyInt>() {
        return Ok(i.clone());
    }
    match py.import("operator")?.call_method1("index", (obj,)) {
        Ok(v) => v.cast_into::<PyInt>().map_err(|_| not_int()),
        Err(e) if e.is_instance_of::<PyException>(py) => Err(not_int()),
        Err(e) => Err(e),
    }
}

/// A non-negative integer at most `limit` (`invalid-argument` / `too-large` naming `name`).
pub fn uint(obj: &Bound<'_, PyAny>, name: &str, limit: u64) -> PyResult<u64> {
    let i = index(obj, name)?;
    if i.lt(0)? {
        return Err(err(Error::invalid(name, format!("{i} (must be >= 0)"))));
    }
    match i.extract::<u64>() {
        Ok(v) if v <= limit => Ok(v),
        Ok(v) => Err(err(Error::too_large(name, v, limit, ""))),
        Err(_) => {
            let v = i.extract::<u128>().unwrap_or(u128::MAX);
            Err(err(Error::too_large(name, v, limit, "")))
        }
    }
}

/// [`uint`] as a `usize`.
pub fn usize_at_most(obj: &Bound<'_, PyAny>, name: &str, limit: u64) -> PyResult<usize> {
    let v = uint(obj, name, limit)?;
    usize::try_from(v).map_err(|_| err(Error::too_large(name, v, usize::MAX, "")))
}

/// An optional [`usize_at_most`]: `None` (absent or Python `None`) stays `None`.
pub fn opt_usize(
    obj: Option<&Bound<'_, PyAny>>,
    name: &str,
    limit: u64,
) -> PyResult<Option<usize>> {
    match obj {
        Some(o) if !o.is_none() => usize_at_most(o, name, limit).map(Some),
        _ => Ok(None),
    }
}

/// Any integer, as `i64`; values beyond int64 saturate (ids: the range check that follows
/// reports them as out of range).
pub fn int_saturating(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    let i = index(obj, name)?;
    match i.extract::<i64>() {
        Ok(v) => Ok(v),
        Err(_) => Ok(if i.lt(0)? { i64::MIN } else { i64::MAX }),
    }
}

/// A truth value: `bool` or numpy's `bool_` only (an int, a string or a tensor where a flag is
/// meant is `invalid-argument`, never read through its truthiness).
pub fn boolean(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
    if is_bool(obj) {
        return obj.is_truthy();
    }
    Err(err(Error::invalid(
        name,
        format!("expected a bool, got {}", type_name(obj)),
    )))
}

/// A list of integers (list, tuple or a 1-D integer tensor), each in `[lo, hi]`, at most
/// `max_len` of them: below `lo` is `invalid-argument`, above `hi` or too many `too-large`.
pub fn int_list(
    obj: &Bound<'_, PyAny>,
    name: &str,
    lo: i64,
    hi: u64,
    max_len: u64,
) -> PyResult<Vec<i64>> {
    if let Ok(n) = obj.len()
        && n as u64 > max_len
    {
        return Err(err(Error::too_large(
            format!("len({name})"),
            n as u64,
            max_len,
            "",
        )));
    }
    let values = ids_1d(obj, name)?;
    if values.len() as u64 > max_len {
        return Err(err(Error::too_large(
            format!("len({name})"),
            values.len() as u64,
            max_len,
            "",
        )));
    }
    for &v in &values {
        if v < lo {
            return Err(err(Error::invalid(name, format!("{v} (must be >= {lo})"))));
        }
        if u64::try_from(v).is_ok_and(|u| u > hi) {
            return Err(err(Error::too_large(name, v as u64, hi, "")));
        }
    }
    Ok(values)
}

/// A real number (`int`, `float`, numpy scalars, anything with `__float__`); not `bool`/`str`.
pub fn float(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
    let bad = || {
        err(Error::invalid(
            name,
            format!("expected a number, got {}", type_name(obj)),
        ))
    };
    if is_bool(obj) || obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
        return Err(bad());
    }
    match obj.extract::<f64>() {
        Ok(v) => Ok(v),
        Err(e) if e.is_instance_of::<PyException>(obj.py()) => Err(bad()),
        Err(e) => Err(e),
    }
}

/// [`float`] as `f32` (values beyond f32 become ±inf, which the engine refuses as non-finite).
pub fn float32(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<f32> {
    #[allow(clippy::cast_possible_truncation)]
    float(obj, name).map(|v| v as f32)
}

/// An optional [`float32`] with a default for `None`.
pub fn opt_float32(obj: Option<&Bound<'_, PyAny>>, name: &str, default: f32) -> PyResult<f32> {
    match obj {
        Some(o) if !o.is_none() => float32(o, name),
        _ => Ok(default),
    }
}

/// A scalar or a per-request list/tuple, each value read by `one` (which names the argument).
pub fn per_request<'py, T>(
    obj: &Bound<'py, PyAny>,
    one: impl Fn(&Bound<'py, PyAny>) -> PyResult<T>,
) -> PyResult<PerRequest<T>> {
    if is_sequence(obj) {
        let mut out = Vec::new();
        for item in obj.try_iter()? {
            out.push(one(&item?)?);
        }
        Ok(PerRequest::Each(out))
    } else {
        Ok(PerRequest::All(one(obj)?))
    }
}

/// A filesystem path (`str`, `bytes` or `os.PathLike`).
pub fn path(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<PathBuf> {
    obj.extract::<PathBuf>().map_err(|_| {
        err(Error::invalid(
            name,
            format!(
                "expected a path (str or os.PathLike), got {}",
                type_name(obj)
            ),
        ))
    })
}

/// A string.
pub fn string(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    obj.extract::<String>().map_err(|_| {
        err(Error::invalid(
            name,
            format!("expected a str, got {}", type_name(obj)),
        ))
    })
}

/// Copy an integer DLPack tensor's ids into an owned `i64` vector (ids are small; a copy taken
/// once means a later change of the caller's buffer can never be read after validation).
pub fn tensor_ids(t: &DlTensor) -> PyResult<Vec<i64>> {
    if let Some(s) = t.slice::<i64>() {
        return Ok(s.to_vec());
    }
    if let Some(s) = t.slice::<i32>() {
        return Ok(s.iter().map(|&x| i64::from(x)).collect());
    }
    if let Some(s) = t.slice::<u32>() {
        return Ok(s.iter().map(|&x| i64::from(x)).collect());
    }
    Err(err(Error::UnsupportedDtype {
        name: t.name().to_string(),
        message: format!(
            "{} is not supported for token ids (expected int32, int64 or uint32)",
            t.dtype().name()
        ),
    }))
}

/// Ids given as a list/tuple of ints or a DLPack integer tensor: `(values, shape)`, copied once.
/// A list is one-dimensional; a tensor keeps its shape.
pub fn ids(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<(Vec<i64>, Vec<usize>)> {
    if is_sequence(obj) {
        let mut out = Vec::new();
        for item in obj.try_iter()? {
            out.push(int_saturating(&item?, name)?);
        }
        let n = out.len();
        return Ok((out, vec![n]));
    }
    if obj.hasattr("__dlpack__").unwrap_or(false) {
        // Ids on a CUDA device (drafts sampled there, say) are read with one small copy.
        #[cfg(feature = "cuda")]
        if let Some(device) = crate::dlpack::cuda::cuda_device_of(obj, name)? {
            return crate::dlpack::cuda::host_ids(obj, name, &device);
        }
        let t = DlTensor::from_py(obj, name)?;
        return Ok((tensor_ids(&t)?, t.shape().to_vec()));
    }
    Err(err(Error::invalid(
        name,
        format!(
            "expected a list of ints or an integer array, got {}",
            type_name(obj)
        ),
    )))
}

/// One-dimensional [`ids`].
pub fn ids_1d(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<i64>> {
    let (values, shape) = ids(obj, name)?;
    if shape.len() != 1 {
        return Err(err(Error::bad_shape(
            name,
            format!("expected one dimension, got shape {shape:?}"),
        )));
    }
    Ok(values)
}

/// Check every id against `[0, vocab)` (`token-out-of-range` naming `name`) and narrow to u32.
pub fn ids_in_vocab(values: &[i64], name: &str, vocab: usize) -> PyResult<Vec<u32>> {
    values
        .iter()
        .map(|&id| {
            usize::try_from(id)
                .ok()
                .filter(|&v| v < vocab)
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| {
                    err(Error::TokenOutOfRange {
                        name: name.to_string(),
                        id,
                        vocab_size: vocab,
                    })
                })
        })
        .collect()
}

/// Ids as `u32` without the vocabulary check, for a kernel that checks ranges itself in its
/// own order: only ids that cannot be token ids at all (negative, or above `u32::MAX`) are
/// refused here, as `token-out-of-range` against `vocab` (the size the kernel will check).
pub fn ids_u32(values: &[i64], name: &str, vocab: usize) -> PyResult<Vec<u32>> {
    values
        .iter()
        .map(|&id| {
            u32::try_from(id).map_err(|_| {
                err(Error::TokenOutOfRange {
                    name: name.to_string(),
                    id,
                    vocab_size: vocab,
                })
            })
        })
        .collect()
}

/// A `{token id: bias}` mapping (`None`: empty), ids as [`uint`] below 2^32 and biases as
/// [`float32`]; the engine checks the vocabulary and the ranges.
pub fn logit_bias(obj: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<Vec<(u32, f32)>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    let map = obj.cast::<pyo3::types::PyDict>().map_err(|_| {
        err(Error::invalid(
            name,
            format!(
                "expected a dict of token id to bias, got {}",
                type_name(obj)
            ),
        ))
    })?;
    map.iter()
        .map(|(k, v)| {
            let id = uint(&k, name, u64::from(u32::MAX))?;
            Ok((id as u32, float32(&v, name)?))
        })
        .collect()
}
