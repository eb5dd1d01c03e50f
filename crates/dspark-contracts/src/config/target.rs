//! The target model's config, as far as a drafter cares.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::limits::{MAX_HIDDEN, MAX_LAYERS, MAX_VOCAB};

/// What a drafter needs to know about its target model.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TargetSpec {
    /// The config file this came from (or `<dict>`).
    pub source: String,
    /// `V_t`: the target's logical vocabulary (`vocab_size`).
    pub vocab_size: usize,
    /// Number of target decoder layers (`num_hidden_layers`).
    pub num_hidden_layers: usize,
    /// Target hidden size.
    pub hidden_size: usize,
    /// `model_type`, if given.
    pub model_type: Option<String>,
}

impl TargetSpec {
    /// Read a target config from a `config.json` path or a directory holding one.
    pub fn from_path(path: &Path) -> Result<Self> {
        super::json::read_config(path, Self::from_value)
    }

    /// Read a target config from parsed JSON. Multimodal configs may nest the language model
    /// under `text_config` (or `thinker_config.text_config`); the nested one is used then.
    /// Sizes are bounded by [`crate::limits`] (`bad-config` naming the key).
    pub fn from_value(value: &Value, file: &str) -> Result<Self> {
        let root = super::json::root_object(value, file)?;
        let text = root
            .get("text_config")
            .or_else(|| {
                root.get("thinker_config")
                    .and_then(|t| t.get("text_config"))
            })
            .and_then(Value::as_object)
            .filter(|t| t.contains_key("vocab_size") || t.contains_key("num_hidden_layers"));
        let (obj, prefix) = match text {
            Some(t) if root.get("text_config").is_some() => (t, "text_config."),
            Some(t) => (t, "thinker_config.text_config."),
            None => (root, ""),
        };
        let get = |key: &str, limit: u64| -> Result<usize> {
            let full = format!("{prefix}{key}");
            let v = obj.get(key).ok_or_else(|| {
                Error::bad_config(file, &full, "missing (required in a target config)")
            })?;
            match v.as_u64() {
                Some(n) if n > limit => Err(Error::bad_config(
                    file,
                    &full,
                    format!("{n} is above the supported limit of {limit}"),
                )),
                Some(n) if n > 0 && !v.is_boolean() => {
                    usize::try_from(n).map_err(|_| Error::bad_config(file, &full, "too large"))
                }
                _ => Err(Error::bad_config(
                    file,
                    &full,
                    format!("expected a positive integer, found {v}"),
                )),
            }
        };
        Ok(Self {
            source: file.to_string(),
            vocab_size: get("vocab_size", MAX_VOCAB)?,
            num_hidden_layers: get("num_hidden_layers", MAX_LAYERS)?,
            hidden_size: get("hidden_size", MAX_HIDDEN)?,
            model_type: obj
                .get("model_type")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_flat_and_nested() {
        let t = TargetSpec::from_value(
            &json!({"vocab_size": 100, "num_hidden_layers": 4, "hidden_size": 8, "model_type": "qwen3"}),
            "t.json",
        )
        .unwrap();
        assert_eq!(
            (t.vocab_size, t.num_hidden_layers, t.hidden_size),
            (100, 4, 8)
        );
        let nested = TargetSpec::from_value(
            &json!({"text_config": {"vocab_size": 7, "num_hidden_layers": 2, "hidden_size": 4}}),
            "t.json",
        )
        .unwrap();
        assert_eq!(nested.vocab_size, 7);
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = TargetSpec::from_value(
            &json!({"vocab_size": "x", "num_hidden_layers": 1, "hidden_size": 1}),
            "t.json",
        )
        .unwrap_err();
        assert_eq!(e.code(), "bad-config");
        assert!(e.to_string().contains("t.json") && e.to_string().contains("vocab_size"));
        let e = TargetSpec::from_value(&json!({"vocab_size": 3, "hidden_size": 1}), "t.json")
            .unwrap_err();
        assert!(e.to_string().contains("num_hidden_layers"));
        let e = TargetSpec::from_value(
            &json!({"vocab_size": true, "num_hidden_layers": 1, "hidden_size": 1}),
            "t.json",
        )
        .unwrap_err();
        assert!(e.to_string().contains("vocab_size"));
    }
}
