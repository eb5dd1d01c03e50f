//! Typed, key-naming access to config values, looked up through an ordered list of scopes.
//!
//! A config key may live in more than one place (e.g. a speculators backbone key at the top
//! level or under `transformer_layer_config`). A [`Fields`] holds those places in priority
//! order; every getter returns the value of the first scope that has the key and names the
//! dotted key of that scope in its error. JSON `null` counts as absent: Hugging Face writes
//! `null` for unset options (`rope_scaling`, `draft_vocab_size`, `head_dim`, ...).

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// A short description of a JSON value for error messages, e.g. `true (a boolean)`.
pub fn describe(value: &Value) -> String {
    let kind = match value {
        Value::Null => return "null".to_string(),
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a float",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    let mut shown = value.to_string();
    if shown.chars().count() > 60 {
        shown = shown.chars().take(57).collect::<String>() + "...";
    }
    format!("{shown} ({kind})")
}

/// An ordered list of JSON objects to look keys up in; the first scope holding a non-null
/// value for a key wins.
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    file: &'a str,
    /// Each object with the dotted prefix its keys are named with in messages.
    scopes: Vec<(&'a Map<String, Value>, String)>,
}

impl<'a> Fields<'a> {
    /// Fields over a single object whose keys are named `{prefix}{key}` (prefix `""` for the
    /// root, `"dflash_config."` for a nested object).
    pub fn new(file: &'a str, obj: &'a Map<String, Value>, prefix: &str) -> Self {
        Self {
            file,
            scopes: Vec::new(),
        }
        .then(obj, prefix)
    }

    /// Add a lower-priority scope.
    pub fn then(mut self, obj: &'a Map<String, Value>, prefix: &str) -> Self {
        self.scopes.push((obj, prefix.to_string()));
        self
    }

    /// The config file named in errors.
    pub fn file(&self) -> &'a str {
        self.file
    }

    /// The first non-null value of `key` and its dotted name.
    pub fn raw(&self, key: &str) -> Option<(&'a Value, String)> {
        self.scopes
            .iter()
            .find_map(|(obj, prefix)| match obj.get(key) {
                None | Some(Value::Null) => None,
                Some(v) => Some((v, format!("{prefix}{key}"))),
            })
    }

    /// `true` when some scope holds a non-null value for `key`.
    pub fn has(&self, key: &str) -> bool {
        self.raw(key).is_some()
    }

    /// A [`Error::BadConfig`] for `key` (already dotted) in this file.
    pub fn bad(&self, key: &str, message: impl Into<String>) -> Error {
        Error::bad_config(self.file, key, message)
    }

    /// A non-negative integer. Booleans, floats (even `5.0`), strings and negative numbers are
    /// errors naming the key.
    pub fn uint(&self, key: &str) -> Result<Option<usize>> {
        let Some((v, name)) = self.raw(key) else {
            return Ok(None);
        };
        as_uint(v).map(Some).ok_or_else(|| {
            self.bad(
                &name,
                format!("expected a non-negative integer, found {}", describe(v)),
            )
        })
    }

    /// A positive (≥ 1) integer, if present.
    pub fn positive(&self, key: &str) -> Result<Option<usize>> {
        match self.uint(key)? {
            Some(0) => {
                let name = self.raw(key).map_or_else(|| key.to_string(), |(_, n)| n);
                Err(self.bad(&name, "must be at least 1, found 0"))
            }
            other => Ok(other),
        }
    }

    /// A positive integer that must be present; `why` says what needs it.
    pub fn required(&self, key: &str, why: &str) -> Result<usize> {
        self.positive(key)?
            .ok_or_else(|| self.bad(&self.name_of(key), format!("missing (required: {why})")))
    }

    /// `value` of `key`, refused above `limit` (a [`crate::limits`] constant) with a
    /// `bad-config` error naming the key: config-derived sizes are bounded before anything is
    /// sized from them.
    pub fn at_most(&self, key: &str, value: usize, limit: u64) -> Result<usize> {
        if value as u64 > limit {
            return Err(self.bad(
                &self.name_of(key),
                format!("{value} is above the supported limit of {limit}"),
            ));
        }
        Ok(value)
    }

    /// [`Fields::positive`], bounded by `limit` (see [`Fields::at_most`]).
    pub fn positive_at_most(&self, key: &str, limit: u64) -> Result<Option<usize>> {
        self.positive(key)?
            .map(|v| self.at_most(key, v, limit))
            .transpose()
    }

    /// [`Fields::required`], bounded by `limit` (see [`Fields::at_most`]).
    pub fn required_at_most(&self, key: &str, why: &str, limit: u64) -> Result<usize> {
        let v = self.required(key, why)?;
        self.at_most(key, v, limit)
    }

    /// A boolean (not `0`/`1`, not `"true"`).
    pub fn boolean(&self, key: &str) -> Result<Option<bool>> {
        let Some((v, name)) = self.raw(key) else {
            return Ok(None);
        };
        v.as_bool()
            .map(Some)
            .ok_or_else(|| self.bad(&name, format!("expected a boolean, found {}", describe(v))))
    }

    /// A finite number (integers accepted, booleans not).
    pub fn float(&self, key: &str) -> Result<Option<f64>> {
        let Some((v, name)) = self.raw(key) else {
            return Ok(None);
        };
        match v.as_f64() {
            Some(x) if x.is_finite() && !v.is_boolean() => Ok(Some(x)),
            _ => Err(self.bad(
                &name,
                format!("expected a finite number, found {}", describe(v)),
            )),
        }
    }

    /// A finite number that must be strictly positive when present.
    pub fn positive_float(&self, key: &str) -> Result<Option<f64>> {
        match self.float(key)? {
            Some(x) if x <= 0.0 => Err(self.bad(
                &self.name_of(key),
                format!("must be greater than 0, found {x}"),
            )),
            other => Ok(other),
        }
    }

    /// A string.
    pub fn string(&self, key: &str) -> Result<Option<&'a str>> {
        let Some((v, name)) = self.raw(key) else {
            return Ok(None);
        };
        v.as_str()
            .map(Some)
            .ok_or_else(|| self.bad(&name, format!("expected a string, found {}", describe(v))))
    }

    /// A nested object, as single-scope [`Fields`] named `{key}.`.
    pub fn object(&self, key: &str) -> Result<Option<Fields<'a>>> {
        let Some((v, name)) = self.raw(key) else {
            return Ok(None);
        };
        match v.as_object() {
            Some(obj) => Ok(Some(Fields::new(self.file, obj, &format!("{name}.")))),
            None => Err(self.bad(&name, format!("expected an object, found {}", describe(v)))),
        }
    }

    /// The dotted name `key` would be reported under (the first scope holding it, else the
    /// first scope).
    pub fn name_of(&self, key: &str) -> String {
        self.raw(key).map(|(_, n)| n).unwrap_or_else(|| {
            let prefix = self.scopes.first().map_or("", |(_, p)| p.as_str());
            format!("{prefix}{key}")
        })
    }
}

/// A JSON integer ≥ 0 (never a boolean or a float) as `usize`.
pub fn as_uint(v: &Value) -> Option<usize> {
    if v.is_boolean() {
        return None;
    }
    v.as_u64().and_then(|n| usize::try_from(n).ok())
}

/// A JSON integer (never a boolean or a float) as `i64`; `None` for anything else, including
/// integers beyond `i64`.
pub fn as_int(v: &Value) -> Option<i64> {
    if v.is_boolean() {
        return None;
    }
    v.as_i64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: &Value) -> &Map<String, Value> {
        v.as_object().unwrap()
    }

    #[test]
    fn first_scope_wins_and_null_is_absent() {
        let top = json!({"a": 1, "n": null});
        let inner = json!({"a": 2, "b": 3, "n": 4});
        let f = Fields::new("c.json", obj(&top), "").then(obj(&inner), "inner.");
        assert_eq!(f.uint("a").unwrap(), Some(1));
        assert_eq!(f.uint("b").unwrap(), Some(3));
        assert_eq!(f.uint("n").unwrap(), Some(4));
        assert_eq!(f.name_of("b"), "inner.b");
        assert_eq!(f.uint("zz").unwrap(), None);
    }

    #[test]
    fn wrong_types_name_the_nested_key() {
        let top = json!({});
        let inner = json!({"k": true, "s": 3, "f": "x", "neg": -2, "fl": 2.0});
        let f = Fields::new("c.json", obj(&top), "").then(obj(&inner), "tlc.");
        for key in ["k", "neg", "fl"] {
            let e = f.uint(key).unwrap_err();
            assert_eq!(e.code(), "bad-config");
            assert!(e.to_string().contains(&format!("`tlc.{key}`")), "{e}");
        }
        assert!(f.string("s").is_err());
        assert!(f.float("f").is_err());
        assert!(f.float("k").is_err());
        assert!(f.boolean("s").is_err());
        assert_eq!(f.float("s").unwrap(), Some(3.0));
    }

    #[test]
    fn describe_truncates_on_char_boundaries() {
        let long = Value::String("é".repeat(100));
        let d = describe(&long);
        assert!(d.ends_with("... (a string)"), "{d}");
        assert_eq!(d.chars().count(), 60 + " (a string)".len());
        assert_eq!(describe(&json!(true)), "true (a boolean)");
        assert_eq!(describe(&json!(2.5)), "2.5 (a float)");
        assert_eq!(describe(&Value::Null), "null");
    }

    #[test]
    fn positive_and_required() {
        let top = json!({"z": 0, "one": 1});
        let f = Fields::new("c.json", obj(&top), "");
        assert!(f.positive("z").unwrap_err().to_string().contains("`z`"));
        assert_eq!(f.required("one", "x").unwrap(), 1);
        let e = f.required("missing", "the backbone").unwrap_err();
        assert!(e.to_string().contains("`missing`") && e.to_string().contains("the backbone"));
    }
}
