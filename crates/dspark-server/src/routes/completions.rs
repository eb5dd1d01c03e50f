//! `POST /v1/completions`.

use std::cell::Cell;

use axum::response::Response;

use crate::api::ApiError;
use crate::api::completions::{CompletionRequest, Prompt};
use crate::api::fields::max_new_tokens;
use crate::api::logprobs::CompletionLogprobs;
use crate::api::response::{CompletionChoice, Usage};
use crate::session::{Finish, Out};
use crate::stream::Chunks;

use super::head::Head;

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: usize = 16;

/// Writes `text_completion` chunks.
struct CompletionChunks {
    head: Head,
    /// Per choice: characters of generated text its chunks so far carried (log-probability
    /// offsets).
    offsets: Vec<Cell<usize>>,
}

impl CompletionChunks {
    fn envelope(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> String {
        self.head.chunk("text_completion", choices, usage)
    }
}

impl CompletionChunks {
    /// Choice `index` of `out`, its log-probabilities' offsets running on from its last
    /// chunk's.
    fn choice(&self, index: usize, out: Out, finish: Option<&Finish>) -> CompletionChoice {
        let logprobs = out.logprobs.as_deref().map(|entries| {
            let offset = self.offsets.get(index).map_or(0, Cell::get);
            let (lp, next) = CompletionLogprobs::of(entries, offset);
            if let Some(c) = self.offsets.get(index) {
                c.set(next);
            }
            lp
        });
        CompletionChoice {
            index,
            text: out.text,
            finish_reason: finish.map(|f| f.reason),
            logprobs,
            dspark: finish.map(|f| f.stats),
        }
    }
}

impl Chunks for CompletionChunks {
    fn opening(&self, _index: usize) -> Option<String> {
        None
    }
    fn text(&self, index: usize, out: Out) -> String {
        self.envelope(vec![self.choice(index, out, None)], None)
    }
    fn finish(&self, index: usize, out: Out, finish: &Finish) -> String {
        self.envelope(vec![self.choice(index, out, Some(finish))], None)
    }
    fn usage(&self, usage: Usage) -> String {
        self.envelope(Vec::new(), Some(usage))
    }
}

impl super::Endpoint for CompletionRequest {
    /// The prompt tokenized (or its ids checked), the request queued, its answer streamed or
    /// whole.
    async fn serve(self, call: super::Call) -> Result<Response, ApiError> {
        let (state, checked) = (&call.state, &call.checked);
        let model = &state.model;
        // A slot first: tokenizing is bounded by the same limit as the queue.
        let slot = state.engine.reserve()?;
        let logprobs = self.logprobs()?;
        let prompt = match self.prompt(model.vocab_size)? {
            Prompt::Text(text) => state.tokenize(text, true, "prompt").await?,
            Prompt::Ids(ids) => ids,
        };
        let max_new = max_new_tokens(
            checked.max_tokens,
            Some(DEFAULT_MAX_TOKENS),
            prompt.len(),
            model.max_model_len,
        )?;
        let chunks = CompletionChunks {
            head: Head::new(state, "cmpl", checked.include_usage),
            offsets: (0..checked.n).map(|_| Cell::new(0)).collect(),
        };
        let whole = |chunks: CompletionChunks, answers: Vec<(Out, Finish)>| {
            let choice = |i, out, finish| chunks.choice(i, out, Some(&finish));
            chunks.head.whole("text_completion", answers, choice)
        };
        let mut spec = state.request_spec(prompt, max_new, checked);
        spec.logprobs = logprobs;
        super::answer(state, slot, spec, checked, call.arrived, chunks, whole).await
    }
}
