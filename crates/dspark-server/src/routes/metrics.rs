//! `GET /metrics`: Prometheus text ([`crate::metrics::render`]).

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::state::AppState;

pub(super) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let text = crate::metrics::render(
        &state.model.name,
        &state.engine.metrics(),
        &state.metrics,
        state.engine.in_flight(),
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}
