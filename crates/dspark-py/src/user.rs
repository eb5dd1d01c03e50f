//! Typed reading of user objects the engine drives: the members of a Python target
//! (`dspark.protocols.TargetModel`) or drafter (`DrafterProtocol`), and what their methods
//! return.
//!
//! The rule, for every value: it is read once, here, with the readers of [`crate::args`], and
//! a bad one is an `InputError` naming where it came from (`target.vocab_size`,
//! `drafter.capture_layer_ids`, `target.forward().logits`):
//! - a missing member, or `None` where a value is needed: `invalid-argument` naming it;
//! - `bool` or `float` where an int is meant, an int where a flag is meant, a value outside its
//!   range: `invalid-argument` / `too-large` (the limits of [`dspark::limits`]);
//! - a method that returns `None`, or an object without the fields its contract names:
//!   `invalid-argument` naming the method; a field that is not a tensor, or of the wrong shape:
//!   `invalid-argument` / `bad-shape` naming the method and the field.
//!
//! An exception the user's own code raises (inside a method, a property getter, `__index__`)
//! is not ours to rename: it reaches the caller unchanged (the engine carries it as
//! [`dspark::Error::Callback`]).

use pyo3::exceptions::PyAttributeError;
use pyo3::prelude::*;

use dspark::Error;

use crate::args;
use crate::errors::err;

/// `owner.name` for messages (`target.vocab_size`).
fn qualified(owner: &str, name: &str) -> String {
    format!("{owner}.{name}")
}

/// `obj.name` where the attribute may be absent: `None` when it is missing or `None`; an
/// exception other than `AttributeError` (raised by the user's property) is kept.
pub fn optional<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    match obj.getattr(name) {
        Ok(v) if v.is_none() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyAttributeError>(obj.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The member `owner.name` of `obj`: missing or `None` is `invalid-argument` naming it.
pub fn member<'py>(
    obj: &Bound<'py, PyAny>,
    owner: &str,
    name: &str,
) -> PyResult<Bound<'py, PyAny>> {
    optional(obj, name)?.ok_or_else(|| {
        let what = if obj.hasattr(name).unwrap_or(false) {
            "is None, a value is needed".to_string()
        } else {
            format!("is missing ({} has no `{name}`)", args::type_name(obj))
        };
        err(Error::invalid(qualified(owner, name), what))
    })
}

/// An integer member in `[min, limit]` (below `min`: `invalid-argument`; above `limit`:
/// `too-large`).
pub fn uint(
    obj: &Bound<'_, PyAny>,
    owner: &str,
    name: &str,
    min: u64,
    limit: u64,
) -> PyResult<usize> {
    let full = qualified(owner, name);
    let value = member(obj, owner, name)?;
    let v = args::int_saturating(&value, &full)?;
    if u64::try_from(v).map_or(true, |v| v < min) {
        return Err(err(Error::invalid(full, format!("{v} (must be >= {min})"))));
    }
    args::usize_at_most(&value, &full, limit)
}

/// An optional integer member (absent or `None`: `None`) at most `limit`.
pub fn opt_uint(
    obj: &Bound<'_, PyAny>,
    owner: &str,
    name: &str,
    limit: u64,
) -> PyResult<Option<usize>> {
    match optional(obj, name)? {
        Some(v) => args::usize_at_most(&v, &qualified(owner, name), limit).map(Some),
        None => Ok(None),
    }
}

/// A flag member (`bool` only).
pub fn flag(obj: &Bound<'_, PyAny>, owner: &str, name: &str) -> PyResult<bool> {
    args::boolean(&member(obj, owner, name)?, &qualified(owner, name))
}

/// A list-of-integers member, each in `[lo, hi]`, at most `max_len` long.
pub fn ints(
    obj: &Bound<'_, PyAny>,
    owner: &str,
    name: &str,
    lo: i64,
    hi: u64,
    max_len: u64,
) -> PyResult<Vec<i64>> {
    args::int_list(
        &member(obj, owner, name)?,
        &qualified(owner, name),
        lo,
        hi,
        max_len,
    )
}

/// What `method` returned, when the contract says it returns an object (not `None`).
pub fn returned<'py>(
    value: Bound<'py, PyAny>,
    method: &str,
    expected: &str,
) -> PyResult<Bound<'py, PyAny>> {
    if value.is_none() {
        return Err(err(Error::invalid(
            method,
            format!("returned None, expected {expected}"),
        )));
    }
    Ok(value)
}

/// The name a field of `method`'s result goes by in messages (`target.forward().logits`).
pub fn field_name(method: &str, field: &str) -> String {
    format!("{method}().{field}")
}

/// Field `field` of the object `method` returned: missing is `invalid-argument` naming the
/// method; `None` is `None` (the caller decides whether the contract allows it).
pub fn field<'py>(
    value: &Bound<'py, PyAny>,
    method: &str,
    field: &str,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    match value.getattr(field) {
        Ok(v) if v.is_none() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyAttributeError>(value.py()) => Err(err(Error::invalid(
            method,
            format!("returned a {} without `.{field}`", args::type_name(value)),
        ))),
        Err(e) => Err(e),
    }
}

/// A field that must be present and not `None`.
pub fn required<'py>(
    value: &Bound<'py, PyAny>,
    method: &str,
    name: &str,
) -> PyResult<Bound<'py, PyAny>> {
    field(value, method, name)?.ok_or_else(|| {
        err(Error::invalid(
            field_name(method, name),
            "is None, expected a tensor",
        ))
    })
}

/// A field that must be a tensor or array (anything exporting DLPack): else
/// `invalid-argument` naming the method and the field.
pub fn tensor<'py>(
    value: &Bound<'py, PyAny>,
    method: &str,
    name: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let t = required(value, method, name)?;
    if !t.hasattr("__dlpack__")? {
        return Err(err(Error::invalid(
            field_name(method, name),
            format!(
                "expected a tensor or array (torch, numpy), got {}",
                args::type_name(&t)
            ),
        )));
    }
    Ok(t)
}

/// `bad-shape` naming `name` unless `found == expected`.
pub fn expect_shape(name: &str, found: &[usize], expected: &[usize]) -> PyResult<()> {
    if found == expected {
        return Ok(());
    }
    Err(err(Error::bad_shape(
        name,
        format!("expected shape {expected:?}, got {found:?}"),
    )))
}
