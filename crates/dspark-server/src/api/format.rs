//! `response_format`: free text, a JSON object, a JSON schema, and the dspark extensions
//! `{"type": "regex", "regex": ...}` and `{"type": "grammar", "grammar": ...}` (Lark syntax, as
//! llguidance reads it), read into the grammar a request's tokens must follow.

use llguidance::api::TopLevelGrammar;
use serde_json::{Value, json};

use super::error::ApiError;

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::invalid("response_format", message)
}

/// `schema` generated compact: `", "` and `": "` between items and keys and no other
/// whitespace (a model that loves whitespace could otherwise fill its budget with it), unless
/// it carries llguidance's own `x-guidance` options.
fn compact(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Some(map) = schema.as_object_mut()
        && !map.contains_key("x-guidance")
    {
        map.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// The grammar `format` asks for (`None`: free text).
pub fn grammar(format: Option<&Value>) -> Result<Option<TopLevelGrammar>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let text = |key: &str| -> Result<String, ApiError> {
        match format.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            _ => Err(bad(format!(
                "response_format.{key} must be a non-empty string"
            ))),
        }
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(TopLevelGrammar::from_json_schema(compact(
            &json!({"type": "object"}),
        )))),
        Some("json_schema") => {
            let schema = format
                .get("json_schema")
                .and_then(|s| s.get("schema"))
                .filter(|s| s.is_object() || s.is_boolean())
                .ok_or_else(|| bad("response_format.json_schema.schema must be a JSON schema"))?;
            Ok(Some(TopLevelGrammar::from_json_schema(compact(schema))))
        }
        Some("regex") => Ok(Some(TopLevelGrammar::from_regex(&text("regex")?))),
        Some("grammar") => Ok(Some(TopLevelGrammar::from_lark(text("grammar")?))),
        Some(other) => Err(bad(format!(
            "response_format.type {other:?}: one of text, json_object, json_schema, regex, grammar"
        ))),
        None => Err(bad("response_format needs a type")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_their_errors() {
        assert!(grammar(None).unwrap().is_none());
        assert!(grammar(Some(&json!({"type": "text"}))).unwrap().is_none());
        for ok in [
            json!({"type": "json_object"}),
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}}),
            json!({"type": "regex", "regex": "[0-9]+"}),
            json!({"type": "grammar", "grammar": "start: \"a\"+"}),
        ] {
            assert!(grammar(Some(&ok)).unwrap().is_some(), "{ok}");
        }
        for bad in [
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"schema": 3}}),
            json!({"type": "regex"}),
            json!({"type": "xml"}),
            json!({}),
        ] {
            let e = grammar(Some(&bad)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("response_format"), "{bad}");
        }
    }
}
