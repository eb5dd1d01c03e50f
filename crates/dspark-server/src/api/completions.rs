//! `POST /v1/completions`: the request body and its prompt (text or token ids).

use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use super::fields::{Common, StreamOptions};

/// The body of a completion request. Unknown fields are refused (422); OpenAI fields this
/// server does not implement are accepted only at their defaults.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    /// The model (when given, must be the served one).
    pub model: Option<String>,
    /// A string, a list of token ids, or a one-element list of either.
    pub prompt: Value,
    /// Tokens to generate at most (default 16, as OpenAI's).
    pub max_tokens: Option<i64>,
    /// Sampling temperature (default 1; 0: greedy).
    pub temperature: Option<f64>,
    /// Nucleus sampling mass in (0, 1].
    pub top_p: Option<f64>,
    /// Keep the k most likely tokens (-1 or 0: off).
    pub top_k: Option<i64>,
    /// Seed of every random draw of the request.
    pub seed: Option<i64>,
    /// Stop strings (a string or a list).
    pub stop: Option<Value>,
    /// Stop token ids.
    pub stop_token_ids: Option<Vec<i64>>,
    /// Do not stop at the model's end-of-sequence ids.
    pub ignore_eos: Option<bool>,
    /// dspark: drafts verified per round at most (0: no drafting).
    pub max_drafts: Option<i64>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Must be 1.
    pub n: Option<i64>,
    /// Must be 1.
    pub best_of: Option<i64>,
    /// Must be false.
    pub echo: Option<bool>,
    /// Must be null.
    pub logprobs: Option<Value>,
    /// Must be null or empty.
    pub suffix: Option<String>,
    /// Must be 0.
    pub presence_penalty: Option<f64>,
    /// Must be 0.
    pub frequency_penalty: Option<f64>,
    /// Must be empty.
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// Ignored.
    pub user: Option<String>,
}

/// A completion prompt: text to tokenize, or token ids as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Text (tokenized with the tokenizer's special tokens, e.g. a BOS).
    Text(String),
    /// Token ids, used as they are.
    Ids(Vec<u32>),
}

fn ids(items: &[Value], vocab_size: usize) -> Result<Vec<u32>, ApiError> {
    items
        .iter()
        .map(|v| match v.as_u64() {
            Some(id) if (id as usize) < vocab_size && id <= u64::from(u32::MAX) => Ok(id as u32),
            _ => Err(ApiError::invalid(
                "prompt",
                format!("token id {v} is not an integer in [0, {vocab_size})"),
            )),
        })
        .collect()
}

impl CompletionRequest {
    /// The shared fields, for [`super::fields::check`].
    pub fn common(&self) -> Common<'_> {
        Common {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: self.seed,
            stop: self.stop.as_ref(),
            stop_token_ids: self.stop_token_ids.as_deref(),
            ignore_eos: self.ignore_eos,
            max_drafts: self.max_drafts,
            stream: self.stream,
            stream_options: self.stream_options.as_ref(),
            n: self.n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: self.logit_bias.as_ref(),
        }
    }

    /// Check the completion-only fields and read the prompt.
    pub fn prompt(&self, vocab_size: usize) -> Result<Prompt, ApiError> {
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(ApiError::unsupported("best_of", "best_of must be 1"));
        }
        if self.echo == Some(true) {
            return Err(ApiError::unsupported("echo", "echo is not supported"));
        }
        if self.logprobs.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::unsupported(
                "logprobs",
                "logprobs are not supported",
            ));
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::unsupported("suffix", "suffix is not supported"));
        }
        let batch = || {
            ApiError::unsupported(
                "prompt",
                "batched prompts are not supported: send one request per prompt",
            )
        };
        let prompt = match &self.prompt {
            Value::String(s) => Prompt::Text(s.clone()),
            Value::Array(items) if items.is_empty() => {
                return Err(ApiError::invalid("prompt", "prompt is empty"));
            }
            Value::Array(items) => match &items[0] {
                Value::Number(_) => Prompt::Ids(ids(items, vocab_size)?),
                Value::String(s) if items.len() == 1 => Prompt::Text(s.clone()),
                Value::Array(inner) if items.len() == 1 => Prompt::Ids(ids(inner, vocab_size)?),
                Value::String(_) | Value::Array(_) => return Err(batch()),
                _ => {
                    return Err(ApiError::invalid(
                        "prompt",
                        "prompt must be a string, a list of token ids, or a list of one of these",
                    ));
                }
            },
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "prompt must be a string or a list of token ids",
                ));
            }
        };
        match &prompt {
            Prompt::Text(s) if s.is_empty() => Err(ApiError::invalid("prompt", "prompt is empty")),
            Prompt::Ids(v) if v.is_empty() => Err(ApiError::invalid("prompt", "prompt is empty")),
            _ => Ok(prompt),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::body::parse;

    fn prompt(json: &str) -> Result<Prompt, ApiError> {
        parse::<CompletionRequest>(json.as_bytes())?.prompt(100)
    }

    #[test]
    fn prompt_shapes() {
        assert_eq!(
            prompt(r#"{"prompt": "hi"}"#).unwrap(),
            Prompt::Text("hi".into())
        );
        assert_eq!(
            prompt(r#"{"prompt": [1, 2]}"#).unwrap(),
            Prompt::Ids(vec![1, 2])
        );
        assert_eq!(
            prompt(r#"{"prompt": ["hi"]}"#).unwrap(),
            Prompt::Text("hi".into())
        );
        assert_eq!(
            prompt(r#"{"prompt": [[3]]}"#).unwrap(),
            Prompt::Ids(vec![3])
        );
        for bad in [
            r#"{"prompt": ""}"#,
            r#"{"prompt": []}"#,
            r#"{"prompt": [100]}"#,
            r#"{"prompt": [-1]}"#,
            r#"{"prompt": [1.5]}"#,
            r#"{"prompt": ["a", "b"]}"#,
            r#"{"prompt": 3}"#,
            r#"{"prompt": "x", "echo": true}"#,
            r#"{"prompt": "x", "best_of": 2}"#,
            r#"{"prompt": "x", "logprobs": 2}"#,
        ] {
            assert_eq!(prompt(bad).unwrap_err().status.as_u16(), 400, "{bad}");
        }
        assert_eq!(prompt(r#"{}"#).unwrap_err().status.as_u16(), 422);
        assert_eq!(
            prompt(r#"{"prompt": "x", "max_tokens": "5"}"#)
                .unwrap_err()
                .status
                .as_u16(),
            422
        );
    }
}
