//! `GET /v1/models` and `GET /v1/models/{id}`.

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};

use crate::api::response::{ModelCard, ModelList};
use crate::state::AppState;

fn card(state: &AppState) -> ModelCard {
    ModelCard {
        id: state.model.name.clone(),
        object: "model",
        created: state.model.created,
        owned_by: "dspark",
        max_model_len: state.model.max_model_len,
    }
}

pub(super) async fn list(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![card(&state)],
    })
}

pub(super) async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    match state.check_model(Some(&id)) {
        Ok(()) => Json(card(&state)).into_response(),
        Err(e) => e.into_response(),
    }
}
