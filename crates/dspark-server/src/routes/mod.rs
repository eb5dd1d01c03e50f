//! The HTTP routes: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`
//! (and `/v1/models/{id}`), `GET /health`, `GET /metrics`; anything else is an OpenAI-style
//! 404 or 405.

mod chat;
mod completions;
mod health;
mod metrics;
mod models;

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::BytesRejection;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::api::ApiError;
use crate::state::AppState;

/// The server's router over `state`.
pub fn router(state: AppState) -> Router {
    let limit = state.max_body_bytes;
    Router::new()
        .route("/v1/completions", post(completions::handle))
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{id}", get(models::get))
        .route("/health", get(health::health))
        .route("/metrics", get(metrics::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn not_found(method: Method, uri: Uri) -> Response {
    ApiError::route_not_found(method.as_str(), uri.path()).into_response()
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    ApiError::method_not_allowed(method.as_str(), uri.path()).into_response()
}

/// The body, or the OpenAI error for one that could not be read (413 over the limit).
fn body(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
        } else {
            ApiError::malformed(format!(
                "cannot read the request body: {}",
                rejection.body_text()
            ))
        }
    })
}

/// The response of a handler's result.
fn respond(result: Result<Response, ApiError>) -> Response {
    result.unwrap_or_else(IntoResponse::into_response)
}
