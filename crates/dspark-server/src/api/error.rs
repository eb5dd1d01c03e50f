//! OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error answered to a client: its status, OpenAI's `type`, the offending parameter (when
/// one is to blame), a machine code and a message.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// OpenAI's error `type` (`invalid_request_error`, `not_found_error`, ...).
    pub kind: &'static str,
    /// The request field to blame, if one is.
    pub param: Option<String>,
    /// A stable machine code (`invalid_value`, `context_length_exceeded`, `queue_full`, ...).
    pub code: &'static str,
    /// What went wrong, for people.
    pub message: String,
    /// Seconds after which a retry may succeed (`Retry-After`), for 429 and 503.
    pub retry_after: Option<u32>,
}

/// The JSON body of an error.
#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: &'a str,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: &'static str, message: String) -> Self {
        Self {
            status,
            kind,
            param: None,
            code,
            message,
            retry_after: None,
        }
    }

    /// 400: a value the request may not have (`param` names the field).
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_value",
            message.into(),
        );
        e.param = Some(param.into());
        e
    }

    /// 400: a body that is not JSON (or not UTF-8).
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "malformed_json",
            message.into(),
        )
    }

    /// 422: JSON of the wrong shape (unknown field, wrong type, missing field).
    pub fn schema(param: Option<String>, message: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request_error",
            "invalid_schema",
            message.into(),
        );
        e.param = param;
        e
    }

    /// 400: the prompt plus the tokens asked for do not fit the model's context.
    pub fn context_length(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::invalid(param, message);
        e.code = "context_length_exceeded";
        e
    }

    /// 400: something the request needs that this server or model does not have.
    pub fn unsupported(param: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = Self::invalid(param, message);
        e.code = "unsupported";
        e
    }

    /// 404: the model named is not the one served.
    pub fn model_not_found(name: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            "model_not_found",
            format!("The model `{name}` does not exist."),
        );
        e.param = Some("model".into());
        e
    }

    /// 404: no such route.
    pub fn route_not_found(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            "route_not_found",
            format!("no route for {method} {path}"),
        )
    }

    /// 405: the route exists, the method does not.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            format!("{method} is not allowed on {path}"),
        )
    }

    /// 413: the body is over the server's limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "body_too_large",
            format!("request body is over the limit of {limit} bytes (--max-body-bytes)"),
        )
    }

    /// 429: every running and queue slot is taken; retry after `retry_after` seconds.
    pub fn queue_full(limit: usize) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "queue_full",
            format!(
                "the server is at its limit of {limit} requests in flight \
                 (--max-running + --max-queue); retry later"
            ),
        );
        e.retry_after = Some(1);
        e
    }

    /// 503: the server is shutting down or its engine has stopped.
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            code,
            message.into(),
        );
        e.retry_after = Some(5);
        e
    }

    /// 500 `internal_error`: the engine (or the tokenizer) failed; the message says how.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal_error",
            message.into(),
        )
    }

    /// An engine error about a request's values (400: `context_length_exceeded` when the
    /// prompt and `max_tokens` outgrow the model or the KV budget, else `invalid_value`, with
    /// `param` naming the request field) or about the engine itself (500 `internal_error`).
    pub fn from_engine(e: &dspark::Error) -> Self {
        if e.kind() != dspark::ErrorKind::Input {
            return Self::internal(format!("{} ({})", e, e.code()));
        }
        let name = e.argument().unwrap_or("request");
        let message = format!("{e} ({})", e.code());
        if matches!(e, dspark::Error::TooLarge { .. }) && name.contains("prompt + max_new_tokens") {
            return Self::context_length("max_tokens", message);
        }
        Self::invalid(http_param(name), message)
    }

    /// The JSON body alone (SSE streams send it as an event when they fail midway).
    pub fn body_json(&self) -> String {
        let body = Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        serde_json::to_string(&body).unwrap_or_else(|_| String::from("{}"))
    }
}

/// The request field an engine argument name refers to: `request.top_p` is `top_p`,
/// `requests[2].max_new_tokens` is `max_tokens`, `request.prompt (budget...)` is `prompt`.
fn http_param(engine: &str) -> String {
    let field = engine
        .split_once('.')
        .map_or(engine, |(_, rest)| rest)
        .split([' ', ':', '.', '['])
        .next()
        .unwrap_or(engine);
    match field {
        "max_new_tokens" => "max_tokens".into(),
        "stop_token_ids" => "stop".into(),
        "" | "request" | "requests" => "request".into(),
        other => other.into(),
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body_json(),
        )
            .into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod vocabulary_tests {
    use super::*;
    use dspark::Error;

    /// The codes docs/cli.md lists for the server's errors.
    const DOCUMENTED: &[&str] = &[
        "malformed_json",
        "invalid_value",
        "context_length_exceeded",
        "unsupported",
        "invalid_schema",
        "model_not_found",
        "route_not_found",
        "method_not_allowed",
        "body_too_large",
        "queue_full",
        "shutting_down",
        "engine_stopped",
        "internal_error",
    ];

    /// One error of every kind the engine raises.
    fn every_engine_error() -> Vec<Error> {
        let s = String::from;
        vec![
            Error::bad_config("config.json", "block_size", "0"),
            Error::NoNoiseToken { file: s("c.json") },
            Error::NoiseTokenOutOfRange {
                file: s("c.json"),
                key: s("mask_token_id"),
                id: 9,
                vocab_size: 3,
            },
            Error::MissingFile {
                path: "x".into(),
                what: s("config"),
            },
            Error::Io {
                path: "x".into(),
                source: std::io::Error::other("disk"),
            },
            Error::BadSafetensors {
                path: "x".into(),
                message: s("bad"),
            },
            Error::ShapeMismatch {
                tensor: s("w"),
                expected: vec![1],
                found: vec![2],
            },
            Error::MissingTensor {
                tensor: s("w"),
                reason: s("r"),
            },
            Error::BadDtype {
                tensor: s("w"),
                dtype: s("I8"),
                expected: s("F32"),
            },
            Error::MissingLmHead {
                draft: 1,
                target: 2,
            },
            Error::MissingD2t {
                draft: 1,
                target: 2,
            },
            Error::MissingEmbedTokens {
                input: 3,
                target: 2,
            },
            Error::D2tWrongLength {
                expected: 1,
                found: 2,
            },
            Error::D2tOutOfRange {
                draft_id: 1,
                target_id: 9,
                target_vocab: 3,
            },
            Error::D2tDuplicate {
                first: 0,
                second: 1,
                target_id: 2,
            },
            Error::TargetMismatch { message: s("m") },
            Error::Multiple(vec![Error::invalid("a", "b")]),
            Error::bad_shape("request.prompt", "empty"),
            Error::UnsupportedDtype {
                name: s("request.prompt"),
                message: s("m"),
            },
            Error::NonFinite {
                name: s("base_logits"),
                message: s("m"),
            },
            Error::TokenOutOfRange {
                name: s("request.stop_token_ids"),
                id: 9,
                vocab_size: 3,
            },
            Error::invalid("request.max_drafts", "9: at most the block size 8"),
            Error::invalid("request.top_p", "0: must be in (0, 1]"),
            Error::too_large("request: prompt + max_new_tokens", 5000, 4096, " tokens"),
            Error::too_large(
                "request: prompt + max_new_tokens + drafts (budget.kv_tokens)",
                5000,
                4096,
                " tokens",
            ),
            Error::too_large(
                "request.prompt (budget.max_batched_tokens)",
                9,
                8,
                " tokens",
            ),
            Error::DeviceUnavailable {
                name: s("device"),
                device: s("cuda:0"),
                message: s("m"),
            },
            Error::DeviceMismatch {
                name: s("x"),
                found: s("cpu"),
                expected: s("cuda:0"),
            },
            Error::callback("on_round", std::io::Error::other("boom")),
            Error::Internal { message: s("m") },
            Error::Candle(candle_core::Error::Msg(s("m"))),
            Error::OutOfMemory { message: s("m") },
        ]
    }

    /// Every engine error has an HTTP mapping with a documented code; request-value errors
    /// name their field in `param` (the issue: `max_drafts` and `top_p` came back with
    /// `invalid-argument` and `param: null`, `--kv-tokens` refusals with `too-large`).
    #[test]
    fn every_engine_error_maps_to_a_documented_code() {
        for e in every_engine_error() {
            let api = ApiError::from_engine(&e);
            assert!(DOCUMENTED.contains(&api.code), "{e:?} -> {}", api.code);
            if e.kind() == dspark::ErrorKind::Input {
                assert_eq!(api.status, StatusCode::BAD_REQUEST, "{e:?}");
                assert!(api.param.is_some(), "{e:?}");
            } else {
                assert_eq!(api.status, StatusCode::INTERNAL_SERVER_ERROR, "{e:?}");
            }
        }
        let param = |e: Error| ApiError::from_engine(&e).param;
        assert_eq!(
            param(Error::invalid("request.max_drafts", "9")).as_deref(),
            Some("max_drafts")
        );
        assert_eq!(
            param(Error::invalid("request.top_p", "0")).as_deref(),
            Some("top_p")
        );
        let kv = Error::too_large(
            "request: prompt + max_new_tokens + drafts (budget.kv_tokens)",
            5000,
            4096,
            " tokens",
        );
        let api = ApiError::from_engine(&kv);
        assert_eq!(
            (api.code, api.param.as_deref()),
            ("context_length_exceeded", Some("max_tokens"))
        );
    }
}
