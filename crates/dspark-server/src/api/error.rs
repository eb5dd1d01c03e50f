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

    /// 500: the engine failed on this request.
    pub fn internal(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            code,
            message.into(),
        )
    }

    /// An engine error about a request's values (400) or the engine itself (500).
    pub fn from_engine(e: &dspark::Error) -> Self {
        match e.kind() {
            dspark::ErrorKind::Input => {
                let mut api = Self::invalid("request", e.to_string());
                api.param = None;
                api.code = e.code();
                api
            }
            _ => Self::internal(e.code(), e.to_string()),
        }
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
