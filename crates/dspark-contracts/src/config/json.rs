//! Reading a `config.json`: bounded, UTF-8, JSON, every failure naming the file.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Read and parse a JSON config from a file path, or from `config.json` inside a directory.
/// Returns the file name used in messages and the parsed value. The file must be a regular
/// file of at most [`crate::limits::MAX_CONFIG_BYTES`] (`bad-config` naming `<file>`).
pub fn read_json(path: &Path) -> Result<(String, Value)> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let (shown, text) = read_text(&file, "config.json")?;
    let value = serde_json::from_str(&text)
        .map_err(|e| Error::bad_config(&shown, "<file>", format!("invalid JSON: {e}")))?;
    Ok((shown, value))
}

/// The config read by [`read_json`] from `path`, normalized by `from_value` (which gets the
/// file name for its messages).
pub(crate) fn read_config<T>(
    path: &Path,
    from_value: impl FnOnce(&Value, &str) -> Result<T>,
) -> Result<T> {
    let (file, value) = read_json(path)?;
    from_value(&value, &file)
}

/// Read the UTF-8 text of the regular file at `path`, at most
/// [`crate::limits::MAX_CONFIG_BYTES`]: the path as shown in messages, and the text
/// (`missing-file` naming `what`, `io`, or `bad-config` naming `<file>`).
pub(crate) fn read_text(path: &Path, what: &str) -> Result<(String, String)> {
    let shown = path.display().to_string();
    let limit = crate::limits::MAX_CONFIG_BYTES;
    let bytes = crate::files::read_bounded(path, limit).map_err(|e| {
        e.into_error(path, what, limit, |why| {
            Error::bad_config(&shown, "<file>", why)
        })
    })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        Error::bad_config(
            &shown,
            "<file>",
            format!("not valid UTF-8: {}", e.utf8_error()),
        )
    })?;
    Ok((shown, text))
}

/// `value` as a JSON object (`bad-config` naming `<root>` of `file` when it is not one).
pub(crate) fn root_object<'a>(value: &'a Value, file: &str) -> Result<&'a Map<String, Value>> {
    value
        .as_object()
        .ok_or_else(|| Error::bad_config(file, "<root>", "expected a JSON object"))
}
