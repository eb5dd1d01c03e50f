//! Reading a `config.json`: bounded, UTF-8, JSON, every failure naming the file.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::files::ReadError;

/// Read and parse a JSON config from a file path, or from `config.json` inside a directory.
/// Returns the file name used in messages and the parsed value. The file must be a regular
/// file of at most [`crate::limits::MAX_CONFIG_BYTES`] (`bad-config` naming `<file>`).
pub fn read_json(path: &Path) -> Result<(String, Value)> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let shown = file.display().to_string();
    let limit = crate::limits::MAX_CONFIG_BYTES;
    let bytes = crate::files::read_bounded(&file, limit).map_err(|e| match e {
        ReadError::NotFound => Error::MissingFile {
            path: file.clone(),
            what: "config.json".into(),
        },
        ReadError::Io(source) => Error::Io {
            path: file.clone(),
            source,
        },
        other => Error::bad_config(&shown, "<file>", other.describe(limit)),
    })?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| Error::bad_config(&shown, "<file>", format!("not valid UTF-8: {e}")))?;
    let value = serde_json::from_str(text)
        .map_err(|e| Error::bad_config(&shown, "<file>", format!("invalid JSON: {e}")))?;
    Ok((shown, value))
}
