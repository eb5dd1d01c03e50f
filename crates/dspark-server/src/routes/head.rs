//! What every chunk and whole answer of one generation request carries (its id, arrival and
//! model), and the two shapes it is written in: a streamed chunk and the whole answer.

use axum::Json;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::api::response::{Envelope, Usage};
use crate::session::{Finish, Out};
use crate::state::AppState;
use crate::stream::total_usage;

/// The request's id, arrival and model, and whether its stream ends with a usage chunk.
pub(super) struct Head {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
}

impl Head {
    /// A fresh `prefix-<hex>` id on the served model.
    pub(super) fn new(state: &AppState, prefix: &str, include_usage: bool) -> Self {
        Self {
            id: state.new_id(prefix),
            created: state.model.created,
            model: state.model.name.clone(),
            include_usage,
        }
    }

    fn envelope<C>(&self, object: &'static str, choices: Vec<C>) -> Envelope<C> {
        Envelope {
            id: self.id.clone(),
            object,
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: None,
        }
    }

    /// A streamed chunk of `object` holding `choices` (`usage` on it when the request asked
    /// for the usage chunk), as JSON text.
    pub(super) fn chunk<C: Serialize>(
        &self,
        object: &'static str,
        choices: Vec<C>,
        usage: Option<Usage>,
    ) -> String {
        let e = Envelope {
            usage: self.include_usage.then_some(usage),
            ..self.envelope(object, choices)
        };
        serde_json::to_string(&e).unwrap_or_default()
    }

    /// The whole answer of `object`: every choice's `answers` written by `choice` (choice `i`
    /// at `i`), and their usage.
    pub(super) fn whole<C: Serialize>(
        &self,
        object: &'static str,
        answers: Vec<(Out, Finish)>,
        mut choice: impl FnMut(usize, Out, Finish) -> C,
    ) -> Response {
        let usage = total_usage(answers.iter().map(|a| &a.1));
        let choices = answers
            .into_iter()
            .enumerate()
            .map(|(i, (out, finish))| choice(i, out, finish))
            .collect();
        Json(Envelope {
            usage: Some(Some(usage)),
            ..self.envelope(object, choices)
        })
        .into_response()
    }
}
