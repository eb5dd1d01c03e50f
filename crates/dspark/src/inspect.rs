//! `dspark inspect`: will this drafter load against this target, and how.

use std::path::Path;

use serde_json::Value;

/// The outcome of inspecting a drafter against a target.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The stable JSON form documented in the README.
    pub json: Value,
}

impl Report {
    /// `true` when the drafter will load.
    pub fn ok(&self) -> bool {
        self.json
            .get("ok")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }
}

/// Inspect the drafter at `draft` (a directory or `config.json`) against the target config at
/// `target` (a directory with `config.json`, or the file itself). Never fails: problems are
/// listed in the report.
pub fn inspect(draft: &Path, target: &Path) -> Report {
    let _ = (draft, target);
    Report { json: Value::Null }
}
