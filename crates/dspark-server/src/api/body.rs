//! A request body to a typed request: UTF-8, then JSON syntax (400), then the schema (422:
//! unknown fields, wrong types, missing fields, each naming the field).

use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Parse `body` as one JSON value of type `T`.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::malformed(format!(
            "request body is not valid UTF-8 (byte {}): send JSON text",
            e.valid_up_to()
        ))
    })?;
    if text.trim().is_empty() {
        return Err(ApiError::malformed(
            "request body is empty: expected a JSON object",
        ));
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                let param = (path != ".").then_some(path);
                let message = match &param {
                    Some(p) => format!("{p}: {inner}"),
                    None => inner.to_string(),
                };
                ApiError::schema(param, message)
            }
            _ => ApiError::malformed(format!("request body is not valid JSON: {inner}")),
        }
    })?;
    de.end()
        .map_err(|e| ApiError::malformed(format!("request body is not valid JSON: {e}")))?;
    // serde reads a struct from an array too; a request is an object.
    if !text.trim_start().starts_with('{') {
        return Err(ApiError::schema(None, "expected a JSON object"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct T {
        a: u32,
    }

    fn status(body: &[u8]) -> StatusCode {
        parse::<T>(body).unwrap_err().status
    }

    #[test]
    fn syntax_is_400_and_schema_is_422() {
        assert!(parse::<T>(br#"{"a": 1}"#).is_ok());
        assert_eq!(status(b""), StatusCode::BAD_REQUEST);
        assert_eq!(status(b"{\"a\": 1"), StatusCode::BAD_REQUEST);
        assert_eq!(status(b"{\"a\": 1} x"), StatusCode::BAD_REQUEST);
        assert_eq!(status(b"\xff\xfe{}"), StatusCode::BAD_REQUEST);
        assert_eq!(status(br#"{"a": "x"}"#), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            status(br#"{"a": 1, "b": 2}"#),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(status(br#"{}"#), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(status(b"[1]"), StatusCode::UNPROCESSABLE_ENTITY);
    }

    #[test]
    fn schema_errors_name_the_field() {
        let e = parse::<T>(br#"{"a": -1}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("a"));
        assert!(e.message.starts_with("a: "), "{}", e.message);
    }
}
