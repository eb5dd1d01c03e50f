//! Format detection and normalization of draft configs into [`DraftSpec`].

use std::path::Path;

use serde_json::Value;

use super::spec::DraftSpec;
use crate::error::{Error, Result};

/// Read and parse a JSON config from a file path, or from `config.json` inside a directory.
/// Returns the file name used in messages and the parsed value.
pub fn read_json(path: &Path) -> Result<(String, Value)> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let shown = file.display().to_string();
    let bytes = std::fs::read(&file).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            Error::MissingFile {
                path: file.clone(),
                what: "config.json".into(),
            }
        } else {
            Error::Io {
                path: file.clone(),
                source,
            }
        }
    })?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| Error::bad_config(&shown, "<file>", format!("not valid UTF-8: {e}")))?;
    let value = serde_json::from_str(text)
        .map_err(|e| Error::bad_config(&shown, "<file>", format!("invalid JSON: {e}")))?;
    Ok((shown, value))
}

impl DraftSpec {
    /// Read a draft config from a `config.json` path or a directory holding one.
    pub fn from_path(path: &Path) -> Result<Self> {
        let (file, value) = read_json(path)?;
        Self::from_value(&value, &file)
    }

    /// Normalize a parsed draft config. `file` names the source in error messages.
    pub fn from_value(value: &Value, file: &str) -> Result<Self> {
        let _ = value;
        Err(Error::bad_config(
            file,
            "<root>",
            "config normalization is not implemented yet",
        ))
    }
}
