//! How a [`Speculator`](super::Speculator) decodes: sampling, seeds, the verify-length policy,
//! and the requests it serves.

use crate::policy::VerifyPolicy;

/// Options of a [`Speculator`](super::Speculator), shared by every request it serves.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculatorOptions {
    /// Drafts verified per round (`None`: the drafter's block size; at most that).
    pub num_speculative_tokens: Option<usize>,
    /// Target sampling temperature; `0` = greedy. The drafter samples at the same temperature.
    pub temperature: f32,
    /// Target top-k (`None` = off).
    pub top_k: Option<usize>,
    /// Target top-p in `(0, 1]` (`1` = off).
    pub top_p: f32,
    /// The call-level seed: request `i` of a call without its own seed draws from
    /// [`call_seed`](crate::engine::call_seed)`(seed, i)`, a stream of its own, so the
    /// requests of a call are independent samples that repeat with the seed. `None`: such
    /// requests draw fresh entropy (every call samples anew).
    pub seed: Option<u64>,
    /// The verify-length policy.
    pub verify: VerifyPolicy,
    /// With a seed (the call's or a request's), sampled tokens repeat with it: under the
    /// scheduling policies such requests run drafted rounds and verify whole blocks
    /// ([`RequestSpec::repeatable`](crate::engine::RequestSpec::repeatable)). `false` lets the
    /// scheduler choose for them too: exact in distribution, but a seed's tokens may change
    /// with timings and the batch. Default `true`.
    pub repeatable: bool,
    /// Keep every verified slot's confidence and outcome in
    /// [`Stats::confidence_records`](super::Stats::confidence_records) (for calibration).
    pub record_confidence: bool,
    /// Penalties and logit bias of every request
    /// ([`RequestSpec::penalties`](crate::engine::RequestSpec::penalties)).
    pub penalties: crate::engine::Penalties,
}

impl Default for SpeculatorOptions {
    /// Greedy, the scheduled policy ([`VerifyPolicy::ScheduledMeasured`]), no call-level seed.
    fn default() -> Self {
        Self {
            num_speculative_tokens: None,
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            seed: None,
            verify: VerifyPolicy::ScheduledMeasured,
            repeatable: true,
            record_confidence: false,
            penalties: crate::engine::Penalties::default(),
        }
    }
}

/// One prompt to continue.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    /// Prompt token ids (at least one), each below the target vocabulary.
    pub prompt: Vec<u32>,
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    /// Ids that end the request once emitted (the stop token is kept in the output).
    pub stop_token_ids: Vec<u32>,
    /// The request's own seed, the unit of reproducibility (as in vLLM): its draws depend only
    /// on this seed, their position and the request's own history, never on where it sits in
    /// the batch. `None`: a stream derived from the options' seed and the request's index in
    /// the call, or fresh entropy without one ([`SpeculatorOptions::seed`]).
    pub seed: Option<u64>,
}

impl Request {
    /// A greedy-friendly request without stop tokens or own seed.
    pub fn new(prompt: Vec<u32>, max_new_tokens: usize) -> Self {
        Self {
            prompt,
            max_new_tokens,
            ..Self::default()
        }
    }
}
