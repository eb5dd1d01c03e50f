//! `GET /health`: 200 `{"status": "ok"}` while serving; 503 while shutting down or when the
//! engine has stopped.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::state::AppState;

pub(super) async fn health(State(state): State<AppState>) -> (StatusCode, Json<Value>) {
    let status = if !state.engine.is_alive() {
        "engine_stopped"
    } else if !state.engine.is_accepting() {
        "shutting_down"
    } else {
        return (StatusCode::OK, Json(json!({"status": "ok"})));
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "status": status })),
    )
}
