//! `POST /v1/chat/completions`: the messages rendered with the model's chat template, then
//! served as a completion of that text.

use axum::response::Response;

use crate::api::ApiError;
use crate::api::chat::ChatRequest;
use crate::api::fields::max_new_tokens;
use crate::api::logprobs::ChatLogprobs;
use crate::api::response::{ChatChoice, ChatChunkChoice, ChatDelta, ChatMessage, Usage};
use crate::session::{Finish, Out};
use crate::stream::Chunks;

use super::head::Head;

/// Writes `chat.completion.chunk`s.
struct ChatChunks(Head);

impl ChatChunks {
    fn envelope(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> String {
        self.0.chunk("chat.completion.chunk", choices, usage)
    }

    fn chunk(
        &self,
        index: usize,
        delta: ChatDelta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<&Finish>,
    ) -> String {
        let choice = ChatChunkChoice {
            index,
            delta,
            finish_reason: finish.map(|f| f.reason),
            logprobs,
            dspark: finish.map(|f| f.stats),
        };
        self.envelope(vec![choice], None)
    }
}

impl Chunks for ChatChunks {
    fn opening(&self, index: usize) -> Option<String> {
        let delta = ChatDelta {
            role: Some("assistant"),
            content: Some(String::new()),
        };
        Some(self.chunk(index, delta, None, None))
    }
    fn text(&self, index: usize, out: Out) -> String {
        self.chunk(
            index,
            ChatDelta {
                role: None,
                content: Some(out.text),
            },
            out.logprobs.as_deref().map(ChatLogprobs::of),
            None,
        )
    }
    fn finish(&self, index: usize, out: Out, finish: &Finish) -> String {
        let content = (!out.text.is_empty()).then_some(out.text);
        self.chunk(
            index,
            ChatDelta {
                role: None,
                content,
            },
            out.logprobs.as_deref().map(ChatLogprobs::of),
            Some(finish),
        )
    }
    fn usage(&self, usage: Usage) -> String {
        self.envelope(Vec::new(), Some(usage))
    }
}

impl super::Endpoint for ChatRequest {
    /// The messages rendered with the chat template and tokenized, the request queued, its
    /// answer streamed or whole.
    async fn serve(self, call: super::Call) -> Result<Response, ApiError> {
        let (state, checked) = (&call.state, &call.checked);
        let model = &state.model;
        let messages = self.messages()?;
        let logprobs = self.logprobs()?;
        let template = model
            .chat
            .as_ref()
            .map_err(|why| ApiError::unsupported("messages", why.clone()))?;
        let text = template.render(&messages, self.add_generation_prompt.unwrap_or(true))?;
        // A slot first: tokenizing is bounded by the same limit as the queue.
        let slot = state.engine.reserve()?;
        let prompt = state.tokenize(text, false, "messages").await?;
        let max_new = max_new_tokens(checked.max_tokens, None, prompt.len(), model.max_model_len)?;
        let chunks = ChatChunks(Head::new(state, "chatcmpl", checked.include_usage));
        let whole = |chunks: ChatChunks, answers: Vec<(Out, Finish)>| {
            chunks
                .0
                .whole("chat.completion", answers, |index, out, finish| {
                    ChatChoice {
                        index,
                        message: ChatMessage {
                            role: "assistant",
                            content: out.text,
                        },
                        finish_reason: Some(finish.reason),
                        logprobs: out.logprobs.as_deref().map(ChatLogprobs::of),
                        dspark: finish.stats,
                    }
                })
        };
        let mut spec = state.request_spec(prompt, max_new, checked);
        spec.logprobs = logprobs;
        super::answer(state, slot, spec, checked, call.arrived, chunks, whole).await
    }
}
