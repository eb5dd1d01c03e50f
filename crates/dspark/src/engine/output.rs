//! What a step hands back: each request's new tokens and, when it ends, why and what it used.

use super::request::RequestId;

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// It emitted one of its stop ids (kept as its last token).
    Stop,
    /// It generated `max_new_tokens` tokens.
    Length,
    /// It was aborted ([`Engine::abort`](super::Engine::abort)) before it finished.
    Aborted,
    /// Its own rows failed a check (non-finite logits, a row without a finite value): it
    /// ends alone, with [`RequestOutput::error`] saying why; the others run on unchanged.
    Error,
}

/// Why a request ended with [`FinishReason::Error`]: the engine error's code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestError {
    /// The error's stable code (`non-finite`, `invalid-argument`).
    pub code: &'static str,
    /// What failed, naming the request's row.
    pub message: String,
}

impl RequestError {
    /// The record of `e`.
    pub fn of(e: &crate::error::Error) -> Self {
        RequestError {
            code: e.code(),
            message: e.to_string(),
        }
    }

    /// A typed error again (for callers that raise it): `non-finite` and `invalid-argument`
    /// keep their code, anything else is `internal`.
    pub fn to_error(&self, what: &str) -> crate::error::Error {
        use crate::error::Error;
        let message = format!("{what}: {}", self.message);
        match self.code {
            "non-finite" => Error::NonFinite {
                name: what.to_string(),
                message,
            },
            "invalid-argument" => Error::invalid(what, message),
            _ => Error::Internal { message },
        }
    }
}

impl FinishReason {
    /// `"stop"`, `"length"`, `"aborted"` or `"error"` (OpenAI's spelling for the first two).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Aborted => "aborted",
            FinishReason::Error => "error",
        }
    }
}

/// What one request did over its life so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RequestUsage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens generated (committed), the stop token included.
    pub generated_tokens: usize,
    /// Rounds it took part in (each commits at least one token).
    pub rounds: usize,
    /// Draft tokens sent to verification.
    pub drafted_tokens: usize,
    /// Of those, accepted.
    pub accepted_tokens: usize,
    /// Times it was preempted (its cache dropped and rebuilt later).
    pub preemptions: usize,
}

impl RequestUsage {
    /// τ: tokens committed per round (`0` before the first round).
    pub fn acceptance_length(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            // The first token comes from the prefill, not from a round.
            self.generated_tokens.saturating_sub(1) as f64 / self.rounds as f64
        }
    }
}

/// One request's part of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestOutput {
    /// Which request.
    pub id: RequestId,
    /// Tokens it committed in this step (empty when it only waited, or was aborted).
    pub new_tokens: Vec<u32>,
    /// With [`RequestSpec::logprobs`](super::RequestSpec): one entry per token of
    /// `new_tokens`, in order (empty otherwise).
    pub logprobs: Vec<crate::sampling::TokenLogprob>,
    /// Drafts verified for it in this step.
    pub drafted: usize,
    /// Of those, accepted.
    pub accepted: usize,
    /// Set when the request ended in this step (it is then gone from the engine).
    pub finish: Option<FinishReason>,
    /// Its usage so far (final when `finish` is set).
    pub usage: RequestUsage,
    /// With [`FinishReason::Error`]: why.
    pub error: Option<RequestError>,
}

/// Where one step's time went (seconds).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepTiming {
    /// In the drafter (proposals, context extension).
    pub drafter_seconds: f64,
    /// In target forwards.
    pub target_seconds: f64,
    /// In the round's kernels: verify lengths, verification and sampling, committing.
    pub kernel_seconds: f64,
    /// The rest of the step: aborts, admission and preemption, planning the round, cache edits
    /// (the engine's per-step overhead).
    pub overhead_seconds: f64,
}

impl StepTiming {
    /// The whole step.
    pub fn total_seconds(&self) -> f64 {
        self.drafter_seconds + self.target_seconds + self.kernel_seconds + self.overhead_seconds
    }
}

/// The result of one [`Engine::step`](super::Engine::step): an entry for every request that
/// committed tokens, finished or was aborted in it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepOutput {
    /// Per request, in the engine's running order.
    pub outputs: Vec<RequestOutput>,
    /// Whether running requests took a round in this step (a step may only prefill joining
    /// requests, or only drop aborted ones).
    pub round: bool,
    /// Of a round, whether it drafted nothing: a scheduling policy found one target-only step
    /// of every running request faster than the best drafted round.
    pub plain: bool,
    /// Where the step's time went.
    pub timing: StepTiming,
    /// Every verified slot whose earlier slots were all accepted, with its confidence and
    /// outcome (only with [`EngineConfig::record_confidence`](super::EngineConfig)).
    pub confidence_records: Vec<ConfidenceRecord>,
}

/// One verified draft slot: its position in the block, the drafter's confidence for it and
/// whether it was accepted, recorded only when every earlier slot of the block was accepted
/// (so `confidence` estimates exactly that conditional acceptance).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConfidenceRecord {
    /// Slot `k` (0 = the first draft).
    pub position: u32,
    /// The confidence head's value for the slot.
    pub confidence: f32,
    /// Whether the target accepted the draft.
    pub accepted: bool,
}
