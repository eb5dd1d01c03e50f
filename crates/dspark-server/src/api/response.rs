//! Response bodies in OpenAI's shape (whole answers and stream chunks), with dspark's own
//! figures on each choice under `"dspark"`.

use serde::Serialize;

/// Token counts of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// The sum.
    pub total_tokens: usize,
}

impl Usage {
    /// `prompt` + `completion`.
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// dspark's figures for one choice.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SpecStats {
    /// τ: tokens committed per verification round.
    pub acceptance_length: f64,
    /// Draft tokens sent to verification.
    pub drafted_tokens: usize,
    /// Of those, accepted.
    pub accepted_tokens: usize,
    /// Verification rounds the request took part in.
    pub rounds: usize,
    /// Times the request was preempted and resumed.
    pub preemptions: usize,
}

/// One choice of a text completion (a whole answer or a chunk).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    /// The choice's place (0 to `n - 1`).
    pub index: usize,
    /// The text (a chunk: the new text).
    pub text: String,
    /// `stop`, `length` or `abort`; null while streaming.
    pub finish_reason: Option<&'static str>,
    /// The tokens' log-probabilities (null unless asked for).
    pub logprobs: Option<super::logprobs::CompletionLogprobs>,
    /// dspark's figures (on the last chunk when streaming).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dspark: Option<SpecStats>,
}

/// The assistant's message of a chat answer.
#[derive(Debug, Clone, Serialize)]
pub struct ChatMessage {
    /// `assistant`.
    pub role: &'static str,
    /// The text.
    pub content: String,
}

/// The new part of a streamed chat message.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatDelta {
    /// `assistant`, on the first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One choice of a chat answer.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// The choice's place (0 to `n - 1`).
    pub index: usize,
    /// The answer.
    pub message: ChatMessage,
    /// `stop`, `length` or `abort`.
    pub finish_reason: Option<&'static str>,
    /// The tokens' log-probabilities (null unless asked for).
    pub logprobs: Option<super::logprobs::ChatLogprobs>,
    /// dspark's figures.
    pub dspark: SpecStats,
}

/// One choice of a chat chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    /// The choice's place (0 to `n - 1`).
    pub index: usize,
    /// The new part.
    pub delta: ChatDelta,
    /// Set on the last chunk.
    pub finish_reason: Option<&'static str>,
    /// The new tokens' log-probabilities (null unless asked for).
    pub logprobs: Option<super::logprobs::ChatLogprobs>,
    /// dspark's figures, on the last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dspark: Option<SpecStats>,
}

/// A whole answer or a chunk: `object` says which.
#[derive(Debug, Clone, Serialize)]
pub struct Envelope<C> {
    /// `cmpl-...` or `chatcmpl-...`, the same on every chunk of a stream.
    pub id: String,
    /// `text_completion`, `chat.completion` or `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds at arrival.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The choices (empty on the usage chunk).
    pub choices: Vec<C>,
    /// Whole answers: the usage. Chunks: absent, or null on every chunk but the usage chunk
    /// when `stream_options.include_usage` is set (OpenAI's shape).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// `GET /v1/models` entry.
#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    /// The served name.
    pub id: String,
    /// `model`.
    pub object: &'static str,
    /// Unix seconds at start.
    pub created: u64,
    /// `dspark`.
    pub owned_by: &'static str,
    /// Context length (prompt + completion) in tokens.
    pub max_model_len: usize,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    /// `list`.
    pub object: &'static str,
    /// The one served model.
    pub data: Vec<ModelCard>,
}
