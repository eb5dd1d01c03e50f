//! Sequential Temperature Scaling (STS): per-position temperatures for the confidence head.
//!
//! Position `k`'s confidence becomes `sigmoid(z_k / T_k)`. The table is loaded from JSON in the
//! SGLang style: an object with a `"temperatures"` array (other keys are ignored).

use crate::error::{Error, Result};
use std::path::Path;

/// The calibration file read from a drafter directory when present.
pub const STS_FILE: &str = "sts.json";

/// Per-position confidence temperatures.
#[derive(Debug, Clone, PartialEq)]
pub struct StsCalibration {
    /// `T_k` for slot `k`; each finite and `> 0`.
    pub temperatures: Vec<f32>,
}

impl StsCalibration {
    /// Build from temperatures, validating each is finite and `> 0` (`bad-config` naming
    /// `temperatures[k]`).
    pub fn new(temperatures: Vec<f32>) -> Result<Self> {
        Self::validate(&temperatures, "<memory>")?;
        Ok(StsCalibration { temperatures })
    }

    fn validate(t: &[f32], file: &str) -> Result<()> {
        if t.is_empty() {
            return Err(Error::bad_config(file, "temperatures", "must not be empty"));
        }
        for (k, &v) in t.iter().enumerate() {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::bad_config(
                    file,
                    format!("temperatures[{k}]"),
                    format!("{v} (must be finite and > 0)"),
                ));
            }
        }
        Ok(())
    }

    /// Parse `{"temperatures": [...], ...}`; `file` names the source in errors.
    fn parse(text: &str, file: &str) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| Error::bad_config(file, "<root>", format!("invalid JSON: {e}")))?;
        let obj = super::json::root_object(&value, file)?;
        let Some(arr) = obj.get("temperatures") else {
            return Err(Error::bad_config(file, "temperatures", "missing"));
        };
        let Some(arr) = arr.as_array() else {
            return Err(Error::bad_config(
                file,
                "temperatures",
                "expected an array of numbers",
            ));
        };
        let mut temps = Vec::with_capacity(arr.len());
        for (k, v) in arr.iter().enumerate() {
            let Some(x) = v.as_f64().filter(|_| !v.is_boolean()) else {
                return Err(Error::bad_config(
                    file,
                    format!("temperatures[{k}]"),
                    format!("expected a number, got {v}"),
                ));
            };
            temps.push(x as f32);
        }
        Self::validate(&temps, file)?;
        Ok(StsCalibration {
            temperatures: temps,
        })
    }

    /// Parse from a JSON string.
    pub fn from_json_str(text: &str) -> Result<Self> {
        Self::parse(text, "<json>")
    }

    /// Read and parse a JSON file (`missing-file`, `io`, `bad-config` naming the path; the file
    /// must be a regular file of at most [`crate::limits::MAX_CONFIG_BYTES`]).
    pub fn from_json_path(path: impl AsRef<Path>) -> Result<Self> {
        let (shown, text) = super::json::read_text(path.as_ref(), "STS calibration JSON")?;
        Self::parse(&text, &shown)
    }

    /// `T_k`; errors when the table has fewer than `k + 1` positions.
    pub fn temperature(&self, k: usize) -> Result<f32> {
        self.temperatures.get(k).copied().ok_or_else(|| {
            Error::invalid(
                "sts",
                format!(
                    "calibration has {} positions, slot {k} needs one",
                    self.temperatures.len()
                ),
            )
        })
    }
}
