//! `POST /v1/chat/completions`: the request body and its messages.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::ApiError;
use super::fields::Common;
use super::shared::request_body;

/// Messages per request at most.
pub const MAX_MESSAGES: usize = 4096;

/// One message of a conversation, as the chat template sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, ... (passed to the template as given).
    pub role: String,
    /// The text (a list of text parts is joined).
    pub content: String,
}

/// A message as sent: `content` is a string, a list of `{"type": "text", "text": ...}`
/// parts, or null.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMessage {
    /// The speaker.
    pub role: String,
    /// The content.
    pub content: Option<Value>,
    /// Ignored (OpenAI's participant name).
    pub name: Option<String>,
}

request_body! {
    /// The body of a chat completion request.
    pub struct ChatRequest {
        /// The conversation.
        pub messages: Vec<RawMessage>,
        /// The newer name of `max_tokens` (wins when both are given).
        pub max_completion_tokens: Option<i64>,
        /// End the rendered prompt with the template's assistant header (default true).
        pub add_generation_prompt: Option<bool>,
        /// Must be false.
        pub logprobs: Option<bool>,
        /// Must be null or 0.
        pub top_logprobs: Option<i64>,
        /// Must be empty: no tool calling.
        pub tools: Option<Vec<Value>>,
        /// Only `"none"` or `"auto"` (without tools).
        pub tool_choice: Option<Value>,
        /// Ignored without tools.
        pub parallel_tool_calls: Option<bool>,
    }
}

fn content_text(i: usize, content: Option<&Value>) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => {
                        return Err(ApiError::unsupported(
                            param,
                            "only text content parts ({\"type\": \"text\", \"text\": ...}) \
                             are supported",
                        ));
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::invalid(
            param,
            "content must be a string or a list of text parts",
        )),
    }
}

impl ChatRequest {
    /// The shared fields, for [`super::fields::check`]: `max_completion_tokens`, the newer name
    /// of `max_tokens`, wins when both are given (default: the room left in the context).
    pub fn common(&self) -> Common<'_> {
        Common {
            max_tokens: self.max_completion_tokens.or(self.max_tokens),
            ..self.shared()
        }
    }

    /// The log-probabilities asked for: `None` without `logprobs: true`, else the number of
    /// alternatives (`top_logprobs`, 0 to 20; sent without `logprobs: true` it is a 400, as
    /// OpenAI answers).
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        let top = super::logprobs::top_count("top_logprobs", self.top_logprobs)?;
        match (self.logprobs.unwrap_or(false), top) {
            (true, top) => Ok(Some(top.unwrap_or(0))),
            (false, Some(n)) if n > 0 => Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            )),
            (false, _) => Ok(None),
        }
    }

    /// Check the chat-only fields and read the messages.
    pub fn messages(&self) -> Result<Vec<Message>, ApiError> {
        if self.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(ApiError::unsupported(
                "tools",
                "tool calling is not supported",
            ));
        }
        match self.tool_choice.as_ref() {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "none" || s == "auto" => {}
            Some(_) => {
                return Err(ApiError::unsupported(
                    "tool_choice",
                    "tool calling is not supported",
                ));
            }
        }
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages", "messages is empty"));
        }
        if self.messages.len() > MAX_MESSAGES {
            return Err(ApiError::invalid(
                "messages",
                format!("at most {MAX_MESSAGES} messages"),
            ));
        }
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                Ok(Message {
                    role: m.role.clone(),
                    content: content_text(i, m.content.as_ref())?,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::body::parse;

    fn messages(json: &str) -> Result<Vec<Message>, ApiError> {
        parse::<ChatRequest>(json.as_bytes())?.messages()
    }

    #[test]
    fn message_shapes() {
        let m = messages(
            r#"{"messages": [{"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": "a"},
                                             {"type": "text", "text": "b"}]}]}"#,
        )
        .unwrap();
        assert_eq!(m[0].content, "s");
        assert_eq!(m[1].content, "ab");
        for bad in [
            r#"{"messages": []}"#,
            r#"{"messages": [{"role": "user", "content": 3}]}"#,
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
            r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{}]}"#,
        ] {
            assert_eq!(messages(bad).unwrap_err().status.as_u16(), 400, "{bad}");
        }
        assert_eq!(
            messages(r#"{"messages": [{"role": "user", "content": "x", "extra": 1}]}"#)
                .unwrap_err()
                .status
                .as_u16(),
            422
        );
    }

    #[test]
    fn max_completion_tokens_wins() {
        let r: ChatRequest = parse(
            br#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 5,
                 "max_completion_tokens": 7}"#,
        )
        .unwrap();
        assert_eq!(r.common().max_tokens, Some(7));
    }
}
