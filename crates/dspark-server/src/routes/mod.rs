//! The HTTP routes: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`
//! (and `/v1/models/{id}`), `GET /health`, `GET /metrics`; anything else is an OpenAI-style
//! 404 or 405.

mod chat;
mod completions;
mod head;
mod health;
mod metrics;
mod models;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use std::time::Instant;

use crate::api::ApiError;
use crate::api::GenerationBody;
use crate::api::body::parse;
use crate::api::chat::ChatRequest;
use crate::api::completions::CompletionRequest;
use crate::api::fields::{Checked, check};
use crate::engine_thread::Reservation;
use crate::session::{Finish, Out, Session};
use crate::state::AppState;
use crate::stream::{Chunks, sse};
use dspark::engine::RequestSpec;

/// The server's router over `state`.
pub fn router(state: AppState) -> Router {
    let limit = state.max_body_bytes;
    Router::new()
        .route("/v1/completions", post(generate::<CompletionRequest>))
        .route("/v1/chat/completions", post(generate::<ChatRequest>))
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

/// A generation request whose body was read and checked: the server's state, the checked
/// shared fields, and when it arrived.
struct Call {
    state: AppState,
    checked: Checked,
    arrived: Instant,
}

/// A generation endpoint: how it serves a body whose shared fields passed [`check`].
trait Endpoint: GenerationBody + DeserializeOwned + Send + 'static {
    /// The answer (streamed or whole) to this body.
    fn serve(self, call: Call) -> impl Future<Output = Result<Response, ApiError>> + Send;
}

/// A generation route: the body read (413 over the limit) and parsed (400 / 422), its model
/// checked (404 when it is not the served one) and its shared fields (400), then served by
/// its endpoint (an [`ApiError`] answers as an OpenAI error).
async fn generate<E: Endpoint>(
    State(state): State<AppState>,
    sent: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let request: E = parse(&body(sent, state.max_body_bytes)?)?;
    state.check_model(request.model_name())?;
    let checked = check(&request.shared_fields(), state.model.vocab_size)?;
    let call = Call {
        state,
        checked,
        arrived,
    };
    request.serve(call).await
}

/// A choice's grammar state (a 400 naming `response_format` when it does not compile, or
/// when the model has no grammar compiler).
fn constraint(
    state: &AppState,
    grammar: &llguidance::api::TopLevelGrammar,
) -> Result<dspark::engine::Constraint, ApiError> {
    let grammars = state.model.grammars.as_ref().map_err(|why| {
        ApiError::unsupported(
            "response_format",
            format!("structured output is unavailable: {why}"),
        )
    })?;
    let guided = grammars
        .compile(grammar.clone())
        .map_err(|e| ApiError::invalid("response_format", format!("the grammar: {e}")))?;
    Ok(dspark::engine::Constraint::new(guided))
}

/// Choice `index`'s seed: a seeded request's first choice has the request's seed and choice
/// `i` one derived from (seed, i), so the choices differ and each repeats; an unseeded
/// request's choices draw fresh entropy each.
fn choice_seed(spec_seed: u64, asked: Option<u64>, index: usize) -> u64 {
    match (asked, index) {
        (_, 0) => spec_seed,
        (Some(seed), i) => dspark::engine::call_seed(seed, i),
        (None, _) => dspark::engine::fresh_seed(),
    }
}

/// The answer to a checked generation request: one session per choice (the first in `slot`,
/// the others each reserving their own), then streamed as `chunks` writes it, or collected
/// and written whole by `whole` (choice `i` at `i`).
async fn answer<C: Chunks>(
    state: &AppState,
    slot: Reservation,
    spec: RequestSpec,
    checked: &Checked,
    arrived: std::time::Instant,
    chunks: C,
    whole: impl FnOnce(C, Vec<(Out, Finish)>) -> Response,
) -> Result<Response, ApiError> {
    // Every choice's spec (its grammar compiled) before any starts: a bad grammar runs nothing.
    let mut specs = Vec::with_capacity(checked.n);
    for i in 0..checked.n {
        let mut one = spec.clone();
        one.seed = choice_seed(spec.seed, checked.seed, i);
        if let Some(g) = &checked.grammar {
            one.constraint = Some(constraint(state, g)?);
        }
        specs.push(one);
    }
    let mut slots = vec![slot];
    for _ in 1..checked.n {
        slots.push(state.engine.reserve()?);
    }
    let mut sessions = Vec::with_capacity(slots.len());
    for (one, slot) in specs.into_iter().zip(slots) {
        let stops = checked.stop_strings.clone();
        sessions.push(Session::start(state, slot, one, stops, arrived).await?);
    }
    if checked.stream {
        return Ok(sse(sessions, chunks, checked.include_usage));
    }
    let answers =
        futures_util::future::try_join_all(sessions.iter_mut().map(Session::collect)).await?;
    Ok(whole(chunks, answers))
}
