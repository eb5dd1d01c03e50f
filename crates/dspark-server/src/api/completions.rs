//! `POST /v1/completions`: the request body and its prompt (text or token ids).

use serde_json::Value;

use super::error::ApiError;
use super::fields::Common;
use super::shared::request_body;

request_body! {
    /// The body of a completion request. Unknown fields are refused (422); OpenAI fields this
    /// server does not implement are accepted only at their defaults.
    pub struct CompletionRequest {
        /// A string, a list of token ids, or a one-element list of either.
        pub prompt: Value,
        /// Must be 1.
        pub best_of: Option<i64>,
        /// Must be false.
        pub echo: Option<bool>,
        /// Must be null.
        pub logprobs: Option<Value>,
        /// Must be null or empty.
        pub suffix: Option<String>,
    }
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
    /// The shared fields, for [`super::fields::check`] (the route gives `max_tokens` OpenAI's
    /// default of 16).
    pub fn common(&self) -> Common<'_> {
        self.shared()
    }

    /// The log-probabilities asked for: `logprobs` (null: none; an integer from 0 to 20, the
    /// alternatives listed per token).
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        match &self.logprobs {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(n) => super::logprobs::top_count("logprobs", Some(n)),
                None => Err(super::logprobs::bad_count("logprobs")),
            },
            Some(_) => Err(super::logprobs::bad_count("logprobs")),
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
