//! The request fields `/v1/completions` and `/v1/chat/completions` share, and their checks:
//! sampling, seed, stop strings and ids, stream options, penalties, the dspark extensions, and
//! the number of choices.

use dspark::engine::SamplingParams;
use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;

/// Stop strings per request at most.
pub const MAX_STOP_STRINGS: usize = 16;
/// Bytes per stop string at most.
pub const MAX_STOP_BYTES: usize = 1024;
/// Stop ids per request at most.
pub const MAX_STOP_IDS: usize = 1024;
/// Choices per request at most (`n`; each takes a slot of the queue).
pub const MAX_CHOICES: usize = 16;

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with the usage (and empty `choices`) before `[DONE]`.
    pub include_usage: Option<bool>,
}

/// Borrowed views of the fields both endpoints have, for [`check`].
#[derive(Debug, Default)]
pub struct Common<'a> {
    /// `max_tokens` (chat: or `max_completion_tokens`).
    pub max_tokens: Option<i64>,
    /// `temperature` (OpenAI's default: 1).
    pub temperature: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `top_k` (`-1` or `0`: off).
    pub top_k: Option<i64>,
    /// `seed`.
    pub seed: Option<i64>,
    /// `stop`: a string or a list of strings.
    pub stop: Option<&'a Value>,
    /// `stop_token_ids`.
    pub stop_token_ids: Option<&'a [i64]>,
    /// `ignore_eos`: do not stop at the model's end-of-sequence ids.
    pub ignore_eos: Option<bool>,
    /// `max_drafts` (dspark): drafts verified per round at most for this request (0: none).
    pub max_drafts: Option<i64>,
    /// `stream`.
    pub stream: Option<bool>,
    /// `stream_options`.
    pub stream_options: Option<&'a StreamOptions>,
    /// `n`: choices, 1 to [`MAX_CHOICES`].
    pub n: Option<i64>,
    /// `presence_penalty`.
    pub presence_penalty: Option<f64>,
    /// `frequency_penalty`.
    pub frequency_penalty: Option<f64>,
    /// `repetition_penalty` (dspark, as vLLM).
    pub repetition_penalty: Option<f64>,
    /// `response_format`.
    pub response_format: Option<&'a Value>,
    /// `logit_bias`.
    pub logit_bias: Option<&'a serde_json::Map<String, Value>>,
}

/// The checked values of [`Common`].
#[derive(Debug, Clone)]
pub struct Checked {
    /// Tokens to generate at most, if the request said.
    pub max_tokens: Option<usize>,
    /// The target's sampling.
    pub sampling: SamplingParams,
    /// The request's seed (`None`: the server draws one).
    pub seed: Option<u64>,
    /// Stop strings, matched over the detokenized text.
    pub stop_strings: Vec<String>,
    /// Stop ids given by the request.
    pub stop_token_ids: Vec<u32>,
    /// Do not add the model's end-of-sequence ids to the stop ids.
    pub ignore_eos: bool,
    /// The request's speculation limit.
    pub max_drafts: Option<usize>,
    /// Stream the answer as server-sent events.
    pub stream: bool,
    /// Send the usage chunk before `[DONE]`.
    pub include_usage: bool,
    /// Penalties and logit bias.
    pub penalties: dspark::engine::Penalties,
    /// Choices (`n`).
    pub n: usize,
    /// The grammar the tokens must follow (`response_format`), compiled per choice.
    pub grammar: Option<llguidance::api::TopLevelGrammar>,
}

fn finite(param: &str, v: f64) -> Result<f64, ApiError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(ApiError::invalid(
            param,
            format!("{param} must be a finite number"),
        ))
    }
}

fn stop_strings(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::invalid("stop", "stop must be a string or a list of strings");
    let strings = match stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if strings.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOP_STRINGS} stop strings"),
        ));
    }
    for s in &strings {
        if s.is_empty() || s.len() > MAX_STOP_BYTES {
            return Err(ApiError::invalid(
                "stop",
                format!("each stop string must have 1 to {MAX_STOP_BYTES} bytes"),
            ));
        }
    }
    Ok(strings)
}

fn stop_ids(ids: Option<&[i64]>, vocab_size: usize) -> Result<Vec<u32>, ApiError> {
    let ids = ids.unwrap_or_default();
    if ids.len() > MAX_STOP_IDS {
        return Err(ApiError::invalid(
            "stop_token_ids",
            format!("at most {MAX_STOP_IDS} stop ids"),
        ));
    }
    ids.iter()
        .map(|&id| match u32::try_from(id) {
            Ok(v) if (v as usize) < vocab_size => Ok(v),
            _ => Err(ApiError::invalid(
                "stop_token_ids",
                format!("stop id {id} is outside the vocabulary [0, {vocab_size})"),
            )),
        })
        .collect()
}

/// `n`: choices per request (default 1), at most [`MAX_CHOICES`].
fn choices(n: Option<i64>) -> Result<usize, ApiError> {
    match n {
        None => Ok(1),
        Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::invalid(
            "n",
            format!("n must be an integer from 1 to {MAX_CHOICES}, got {n}"),
        )),
    }
}

/// Check the shared fields against a target vocabulary of `vocab_size` ids.
pub fn check(c: &Common<'_>, vocab_size: usize) -> Result<Checked, ApiError> {
    let n = choices(c.n)?;
    let max_tokens = match c.max_tokens {
        None => None,
        Some(n) if n >= 1 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        Some(n) => {
            return Err(ApiError::invalid(
                "max_tokens",
                format!("max_tokens must be at least 1, got {n}"),
            ));
        }
    };
    let temperature = finite("temperature", c.temperature.unwrap_or(1.0))?;
    if !(0.0..=f64::from(f32::MAX)).contains(&temperature) {
        return Err(ApiError::invalid(
            "temperature",
            format!("temperature must be >= 0, got {temperature}"),
        ));
    }
    let top_p = finite("top_p", c.top_p.unwrap_or(1.0))?;
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(
            "top_p",
            format!("top_p must be in (0, 1], got {top_p}"),
        ));
    }
    let top_k = match c.top_k {
        None | Some(-1) | Some(0) => None,
        Some(k) if k >= 1 => Some(usize::try_from(k).unwrap_or(usize::MAX).min(vocab_size)),
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k must be >= 1, or -1 / 0 for off; got {k}"),
            ));
        }
    };
    let max_drafts = match c.max_drafts {
        None => None,
        Some(d) if d >= 0 => Some(usize::try_from(d).unwrap_or(usize::MAX)),
        Some(d) => {
            return Err(ApiError::invalid(
                "max_drafts",
                format!("max_drafts must be >= 0, got {d}"),
            ));
        }
    };
    // As in Python: a seed is an unsigned 64-bit integer.
    let seed = match c.seed {
        None => None,
        Some(s) => Some(
            u64::try_from(s)
                .map_err(|_| ApiError::invalid("seed", format!("seed must be >= 0, got {s}")))?,
        ),
    };
    let stream = c.stream.unwrap_or(false);
    let include_usage = c
        .stream_options
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "stream_options needs stream: true",
        ));
    }
    Ok(Checked {
        max_tokens,
        sampling: SamplingParams {
            temperature: temperature as f32,
            top_k,
            top_p: top_p as f32,
        },
        seed,
        stop_strings: stop_strings(c.stop)?,
        stop_token_ids: stop_ids(c.stop_token_ids, vocab_size)?,
        ignore_eos: c.ignore_eos.unwrap_or(false),
        max_drafts,
        stream,
        include_usage,
        n,
        grammar: super::format::grammar(c.response_format)?,
        penalties: super::penalties::penalties(
            c.presence_penalty,
            c.frequency_penalty,
            c.repetition_penalty,
            c.logit_bias,
            vocab_size,
        )?,
    })
}

/// The tokens a request may generate: what it asked for (else `default`, else all the room
/// left), refused when the prompt and that do not fit `max_model_len`.
pub fn max_new_tokens(
    asked: Option<usize>,
    default: Option<usize>,
    prompt_len: usize,
    max_model_len: usize,
) -> Result<usize, ApiError> {
    if prompt_len >= max_model_len {
        return Err(ApiError::context_length(
            "prompt",
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, your \
                 prompt has {prompt_len} tokens, which leaves no room for a completion."
            ),
        ));
    }
    let room = max_model_len - prompt_len;
    match asked {
        Some(n) if n > room => Err(ApiError::context_length(
            "max_tokens",
            format!(
                "This model's maximum context length is {max_model_len} tokens. However, you \
                 requested {} tokens ({prompt_len} in the prompt, {n} for the completion).",
                prompt_len.saturating_add(n)
            ),
        )),
        Some(n) => Ok(n),
        None => Ok(default.map_or(room, |d| d.min(room))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_openai_s() {
        let c = check(&Common::default(), 100).unwrap();
        assert_eq!(c.sampling.temperature, 1.0);
        assert_eq!(c.sampling.top_p, 1.0);
        assert_eq!(c.sampling.top_k, None);
        assert!(!c.stream && !c.include_usage && !c.ignore_eos);
        assert_eq!(c.max_tokens, None);
    }

    #[test]
    fn bad_values_name_their_field() {
        /// A change to the default fields, and the field it makes bad.
        type Case = (fn(&mut Common<'_>), &'static str);
        let cases: [Case; 11] = [
            (|c| c.max_tokens = Some(0), "max_tokens"),
            (|c| c.max_tokens = Some(-5), "max_tokens"),
            (|c| c.temperature = Some(-0.1), "temperature"),
            (|c| c.seed = Some(-1), "seed"),
            (|c| c.temperature = Some(f64::NAN), "temperature"),
            (|c| c.top_p = Some(0.0), "top_p"),
            (|c| c.top_p = Some(1.5), "top_p"),
            (|c| c.top_k = Some(-2), "top_k"),
            (|c| c.max_drafts = Some(-1), "max_drafts"),
            (|c| c.n = Some(0), "n"),
            (|c| c.presence_penalty = Some(2.5), "presence_penalty"),
        ];
        for (edit, field) in cases {
            let mut c = Common::default();
            edit(&mut c);
            let e = check(&c, 100).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{e}");
            assert_eq!(e.status.as_u16(), 400);
        }
    }

    #[test]
    fn stops() {
        let one = json!("END");
        let many = json!(["a", "b"]);
        let mixed = json!(["a", 3]);
        let empty = json!([""]);
        let c = |v| Common {
            stop: Some(v),
            ..Default::default()
        };
        assert_eq!(check(&c(&one), 10).unwrap().stop_strings, ["END"]);
        assert_eq!(check(&c(&many), 10).unwrap().stop_strings, ["a", "b"]);
        assert!(check(&c(&mixed), 10).is_err());
        assert!(check(&c(&empty), 10).is_err());
        let ids = [1i64, 9];
        let c = Common {
            stop_token_ids: Some(&ids),
            ..Default::default()
        };
        assert_eq!(check(&c, 10).unwrap().stop_token_ids, [1, 9]);
        assert!(check(&c, 9).is_err());
    }

    #[test]
    fn context_room() {
        assert_eq!(max_new_tokens(None, Some(16), 10, 100).unwrap(), 16);
        assert_eq!(max_new_tokens(None, None, 10, 100).unwrap(), 90);
        assert_eq!(max_new_tokens(None, Some(16), 95, 100).unwrap(), 5);
        assert_eq!(max_new_tokens(Some(90), None, 10, 100).unwrap(), 90);
        let e = max_new_tokens(Some(91), None, 10, 100).unwrap_err();
        assert_eq!(e.code, "context_length_exceeded");
        assert!(max_new_tokens(None, None, 100, 100).is_err());
        assert!(max_new_tokens(Some(usize::MAX), None, 10, 100).is_err());
    }
}
