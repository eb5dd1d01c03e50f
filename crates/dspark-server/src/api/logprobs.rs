//! Log-probabilities in OpenAI's two shapes (chat: `content` entries with `bytes` and
//! `top_logprobs`; completions: parallel `tokens` / `token_logprobs` / `top_logprobs` /
//! `text_offset` lists), and the check of the count a request asks for.

use serde::Serialize;
use serde_json::{Map, Value};

use super::ApiError;
use crate::logprobs::{LogprobEntry, Piece};
use dspark::sampling::MAX_TOP_LOGPROBS;

/// The 400 of a count that is not an integer in `[0, 20]`.
pub fn bad_count(field: &str) -> ApiError {
    ApiError::invalid(
        field,
        format!("{field} must be an integer from 0 to {MAX_TOP_LOGPROBS}"),
    )
}

/// `count` checked: `None` when absent, else in `[0, 20]`.
pub fn top_count(field: &str, count: Option<i64>) -> Result<Option<usize>, ApiError> {
    match count {
        None => Ok(None),
        Some(n) => match usize::try_from(n) {
            Ok(n) if n <= MAX_TOP_LOGPROBS => Ok(Some(n)),
            _ => Err(bad_count(field)),
        },
    }
}

/// A token of a chat entry's `top_logprobs`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatTop {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// One generated token of a chat answer.
#[derive(Debug, Clone, Serialize)]
pub struct ChatEntry {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// The likeliest tokens at its position.
    pub top_logprobs: Vec<ChatTop>,
}

/// A chat choice's (or chunk's) `logprobs`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatEntry>,
    /// Always null.
    pub refusal: Option<()>,
}

fn top(piece: &Piece, logprob: f32) -> ChatTop {
    ChatTop {
        token: piece.text.clone(),
        logprob,
        bytes: piece.bytes.clone(),
    }
}

impl ChatLogprobs {
    /// The chat shape of `entries`.
    pub fn of(entries: &[LogprobEntry]) -> Self {
        let content = entries
            .iter()
            .map(|e| ChatEntry {
                token: e.token.text.clone(),
                logprob: e.logprob,
                bytes: e.token.bytes.clone(),
                top_logprobs: e.top.iter().map(|(p, v)| top(p, *v)).collect(),
            })
            .collect();
        Self {
            content,
            refusal: None,
        }
    }
}

/// A completion choice's (or chunk's) `logprobs`.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionLogprobs {
    /// Each generated token's text.
    pub tokens: Vec<String>,
    /// Each one's log-probability.
    pub token_logprobs: Vec<f32>,
    /// Each position's likeliest tokens, text to log-probability (two ids with one text keep
    /// the likelier).
    pub top_logprobs: Vec<Map<String, Value>>,
    /// Each token's offset in characters into the generated text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// The completion shape of `entries`, whose first token starts at character `offset` of
    /// the generated text; returns the offset after the last.
    pub fn of(entries: &[LogprobEntry], mut offset: usize) -> (Self, usize) {
        let mut out = Self {
            tokens: Vec::with_capacity(entries.len()),
            token_logprobs: Vec::with_capacity(entries.len()),
            top_logprobs: Vec::with_capacity(entries.len()),
            text_offset: Vec::with_capacity(entries.len()),
        };
        for e in entries {
            out.tokens.push(e.token.text.clone());
            out.token_logprobs.push(e.logprob);
            let mut map = Map::new();
            for (p, v) in &e.top {
                // Most likely first: an id sharing an earlier one's text is the less likely.
                if !map.contains_key(&p.text) {
                    map.insert(p.text.clone(), Value::from(*v));
                }
            }
            out.top_logprobs.push(map);
            out.text_offset.push(offset);
            offset += e.token.text.chars().count();
        }
        (out, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(s: &str) -> Piece {
        Piece {
            text: s.into(),
            bytes: s.as_bytes().to_vec(),
        }
    }

    #[test]
    fn counts_are_checked() {
        assert_eq!(top_count("n", None).unwrap(), None);
        assert_eq!(top_count("n", Some(20)).unwrap(), Some(20));
        for bad in [-1, 21, 10_000] {
            let e = top_count("top_logprobs", Some(bad)).unwrap_err();
            assert_eq!(e.status.as_u16(), 400);
            assert_eq!(e.param.as_deref(), Some("top_logprobs"));
        }
    }

    #[test]
    fn completion_offsets_run_on_across_chunks() {
        let e = |t: &str| LogprobEntry {
            token: piece(t),
            logprob: -0.5,
            top: vec![(piece(t), -0.5), (piece("x"), -1.0), (piece(t), -2.0)],
        };
        let (a, next) = CompletionLogprobs::of(&[e("hé"), e(" lo")], 0);
        assert_eq!(a.text_offset, vec![0, 2]);
        assert_eq!(next, 5);
        let (b, _) = CompletionLogprobs::of(&[e("!")], next);
        assert_eq!(b.text_offset, vec![5]);
        // The likelier of two same-text ids is kept.
        assert_eq!(a.top_logprobs[0]["hé"], Value::from(-0.5f32));
        assert_eq!(a.top_logprobs[0].len(), 2);
    }
}
