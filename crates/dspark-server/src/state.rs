//! What every route shares: the engine handle, the model, the metrics and the limits.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dspark::engine::RequestSpec;

use crate::api::ApiError;
use crate::api::fields::Checked;
use crate::engine_thread::EngineHandle;
use crate::metrics::ServerMetrics;
use crate::model::ModelInfo;

/// The routes' shared state (cheap to clone).
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

/// The contents of [`AppState`].
pub struct Inner {
    /// The engine thread.
    pub engine: EngineHandle,
    /// The served model.
    pub model: ModelInfo,
    /// The server's counters and histograms.
    pub metrics: Arc<ServerMetrics>,
    /// Request bodies above this get 413.
    pub max_body_bytes: usize,
    /// `--num-speculative-tokens 0`: every request gets `max_drafts = 0`.
    pub no_drafting: bool,
    ids: AtomicU64,
    random: RandomState,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// The state over a running engine thread.
    pub fn new(
        engine: EngineHandle,
        model: ModelInfo,
        metrics: Arc<ServerMetrics>,
        max_body_bytes: usize,
        no_drafting: bool,
    ) -> Self {
        Self(Arc::new(Inner {
            engine,
            model,
            metrics,
            max_body_bytes,
            no_drafting,
            ids: AtomicU64::new(0),
            random: RandomState::new(),
        }))
    }

    /// A 404 unless `name` is absent or the served model's.
    pub fn check_model(&self, name: Option<&str>) -> Result<(), ApiError> {
        match name {
            Some(n) if n != self.model.name => Err(ApiError::model_not_found(n)),
            _ => Ok(()),
        }
    }

    /// A fresh response id, `prefix-<hex>`.
    pub fn new_id(&self, prefix: &str) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:016x}", self.random.hash_one(n))
    }

    /// Tokenize `text` off the async workers; `special`: add the tokenizer's special tokens
    /// (completions), not for rendered chat templates (they write their own). `param` names
    /// the field the text came from. A text longer than the context could hold at the
    /// tokenizer's longest token is refused unread (`context_length_exceeded`), so a huge
    /// prompt costs no tokenizer memory.
    /// Callers hold an engine slot ([`crate::engine_thread::EngineHandle::reserve`]) while
    /// they tokenize, so at most that many texts are tokenized at once.
    pub async fn tokenize(
        &self,
        text: String,
        special: bool,
        param: &str,
    ) -> Result<Vec<u32>, ApiError> {
        let bound = self
            .model
            .max_model_len
            .saturating_mul(self.model.max_token_bytes);
        if text.len() > bound {
            return Err(ApiError::context_length(
                param,
                format!(
                    "This model's maximum context length is {} tokens, and no token stands for \
                     more than {} bytes of text, but the {param} is {} bytes",
                    self.model.max_model_len,
                    self.model.max_token_bytes,
                    text.len()
                ),
            ));
        }
        let tokenizer = Arc::clone(&self.model.tokenizer);
        let encoded = tokio::task::spawn_blocking(move || tokenizer.encode(text, special))
            .await
            .map_err(|e| ApiError::internal(format!("the tokenizer failed: {e}")))?
            .map_err(|e| {
                ApiError::invalid("prompt", format!("the prompt does not tokenize: {e}"))
            })?;
        let ids = encoded.get_ids().to_vec();
        if ids.is_empty() {
            return Err(ApiError::invalid("prompt", "the prompt has no tokens"));
        }
        Ok(ids)
    }

    /// The engine request for a checked request.
    pub fn request_spec(
        &self,
        prompt: Vec<u32>,
        max_new_tokens: usize,
        c: &Checked,
    ) -> RequestSpec {
        let mut stop_token_ids = c.stop_token_ids.clone();
        if !c.ignore_eos {
            for &id in &self.model.eos_ids {
                if !stop_token_ids.contains(&id) {
                    stop_token_ids.push(id);
                }
            }
        }
        RequestSpec {
            prompt,
            max_new_tokens,
            stop_token_ids,
            sampling: c.sampling,
            // An unseeded request draws fresh entropy, as in the engine and in Python.
            seed: c.seed.unwrap_or_else(dspark::engine::fresh_seed),
            max_drafts: if self.no_drafting {
                Some(0)
            } else {
                c.max_drafts
            },
            repeatable: c.seed.is_some(),
            logprobs: None,
            penalties: c.penalties.clone(),
            constraint: None,
        }
    }
}
