//! What a caller hands the engine: one request ([`RequestSpec`]), its sampling
//! ([`SamplingParams`]) and the id the engine gives it back ([`RequestId`]).

use crate::error::{Error, Result};

/// The engine's handle on one request: unique for the engine's lifetime, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "request {}", self.0)
    }
}

/// How a request's tokens are drawn from the target distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Temperature; `0` = greedy (argmax, ties → lowest id). Finite and `>= 0`.
    pub temperature: f32,
    /// Keep the `k` most likely tokens (`None` = off; `Some(0)` is an error).
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches `top_p`, in `(0, 1]`
    /// (`1` = off).
    pub top_p: f32,
}

impl Default for SamplingParams {
    /// Greedy.
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
        }
    }
}

impl SamplingParams {
    /// `true` when tokens are the argmax (a temperature below
    /// [`crate::sampling::GREEDY_BELOW`], zero included).
    pub fn is_greedy(&self) -> bool {
        crate::sampling::is_greedy_temperature(self.temperature)
    }

    /// Check the values; errors name `what` (e.g. `request 3`) and the field.
    pub fn check(&self, what: &str) -> Result<()> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(Error::invalid(
                format!("{what}.temperature"),
                format!("{t}: must be finite and >= 0"),
            ));
        }
        if self.top_k == Some(0) {
            return Err(Error::invalid(
                format!("{what}.top_k"),
                "0: must be >= 1 (or off)",
            ));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(Error::invalid(
                format!("{what}.top_p"),
                format!("{p}: must be in (0, 1]"),
            ));
        }
        Ok(())
    }
}

/// One request: a prompt to continue, its budget, stop ids, sampling, seed and speculation
/// limit.
///
/// Randomness: the request's draws depend only on `seed`, the position they are drawn at and
/// the request's own history: never on its place in a batch, on what else runs, or on when
/// others join or leave (see [`crate::engine`] for which verify policies keep that promise
/// for sampled tokens).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestSpec {
    /// Prompt token ids (at least one), each below the target vocabulary.
    pub prompt: Vec<u32>,
    /// Tokens to generate at most (the request finishes with `length` when it has them).
    pub max_new_tokens: usize,
    /// Ids that end the request once emitted (`stop`; the stop token is kept in the output).
    pub stop_token_ids: Vec<u32>,
    /// How tokens are drawn.
    pub sampling: SamplingParams,
    /// The base of every random stream of this request.
    pub seed: u64,
    /// Drafts verified per round at most for this request (`None`: the engine's limit; `0`:
    /// no drafting, the request decodes one token per round).
    pub max_drafts: Option<usize>,
    /// The caller chose the seed and expects a sampled request's tokens to repeat with it.
    /// The scheduling policies choose verify lengths and plain rounds from timings and the
    /// batch, and a sampled token depends on whether its position was verified as a draft; so
    /// under them the rounds such a request runs in draft, and it verifies its whole block (to
    /// its own limits), as under [`VerifyPolicy::Full`](crate::policy::VerifyPolicy::Full).
    /// Greedy requests repeat under every policy and ignore it.
    pub repeatable: bool,
    /// Report each generated token's log-probability with this many most likely alternatives
    /// (at most [`MAX_TOP_LOGPROBS`](crate::sampling::MAX_TOP_LOGPROBS); `None`: no
    /// log-probabilities). They come from the verification forward's rows (no extra forward),
    /// under the distribution the token was drawn from (see
    /// [`token_logprobs`](crate::sampling::token_logprobs)).
    pub logprobs: Option<usize>,
    /// Presence, frequency and repetition penalties and a logit bias: the target distribution
    /// the request's tokens follow, changed at each position from the tokens before it
    /// (default: unchanged).
    pub penalties: super::Penalties,
    /// Structured output: the grammar the request's tokens must follow (`None`: free text).
    /// See [`TokenConstraint`](super::TokenConstraint).
    pub constraint: Option<super::Constraint>,
}

impl RequestSpec {
    /// A greedy request with seed 0, no stop ids and the engine's speculation limit.
    pub fn new(prompt: Vec<u32>, max_new_tokens: usize) -> Self {
        Self {
            prompt,
            max_new_tokens,
            stop_token_ids: Vec::new(),
            sampling: SamplingParams::default(),
            seed: 0,
            max_drafts: None,
            repeatable: false,
            logprobs: None,
            penalties: super::Penalties::default(),
            constraint: None,
        }
    }
}
