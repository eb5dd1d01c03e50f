//! Helpers for the `config_*` tests: parse, assert a `bad-config`, edit fixtures.

use dspark::{DraftSpec, Error};
use serde_json::Value;

/// The file name every helper parses under.
pub const FILE: &str = "drafts/x/config.json";

/// Normalize `v` as a draft config from [`FILE`].
pub fn parse(v: &Value) -> Result<DraftSpec, Error> {
    DraftSpec::from_value(v, FILE)
}

/// Assert `v` fails with `bad-config` naming `key` (dotted), the file, and `needle`.
#[track_caller]
pub fn bad(v: &Value, key: &str, needle: &str) {
    let e = parse(v).expect_err("config must be rejected");
    let msg = e.to_string();
    assert_eq!(e.code(), "bad-config", "{msg}");
    match &e {
        Error::BadConfig { file, key: k, .. } => {
            assert_eq!(file, FILE);
            assert_eq!(k, key, "{msg}");
        }
        other => panic!("expected BadConfig, got {other:?}"),
    }
    assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
}

/// Assert every `(config, path, value, key, needle)`: `config` with `value` at `path` fails
/// as [`bad`] says.
#[track_caller]
pub fn bad_edits<const N: usize>(cases: [(Value, &[&str], Value, &str, &str); N]) {
    for (config, path, value, key, needle) in cases {
        bad(&with(config, path, value), key, needle);
    }
}

/// The object holding the last key of `path` in `v` (created where absent), and that key.
fn parent<'v, 'p>(v: &'v mut Value, path: &[&'p str]) -> (&'v mut Value, &'p str) {
    let (last, parents) = path.split_last().unwrap();
    let mut cur = v;
    for p in parents {
        cur = &mut cur[*p];
    }
    (cur, last)
}

/// `v` with the value at `path` replaced by `new`.
pub fn with(mut v: Value, path: &[&str], new: Value) -> Value {
    let (at, key) = parent(&mut v, path);
    at[key] = new;
    v
}

/// `v` without the key at `path`.
pub fn without(mut v: Value, path: &[&str]) -> Value {
    let (at, key) = parent(&mut v, path);
    at.as_object_mut().unwrap().remove(key);
    v
}
