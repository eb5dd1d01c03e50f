//! How an [`Engine`](super::Engine) serves: the verify-length policy, its speculation limit
//! and the memory budget that admits requests.

use crate::policy::VerifyPolicy;

/// Limits that admit requests into the running batch and preempt them when memory runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Requests in the running batch at most.
    pub max_running: usize,
    /// New tokens one step's target forward takes at most (prompts of joining requests and
    /// the verified blocks of running ones).
    pub max_batched_tokens: usize,
    /// KV cache tokens the running requests may hold together (`None`: unbounded). A request
    /// whose prompt plus budget can never fit is refused at `add_request`; a running request
    /// that cannot grow preempts the newest one.
    pub kv_tokens: Option<usize>,
}

impl Default for Budget {
    /// 256 running requests, 8192 tokens a step, no KV limit.
    fn default() -> Self {
        Self {
            max_running: 256,
            max_batched_tokens: 8192,
            kv_tokens: None,
        }
    }
}

/// The engine's options.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// How many of each request's drafts a round verifies.
    pub verify: VerifyPolicy,
    /// Drafts verified per round at most (`None`: the drafter's block); a request's own
    /// `max_drafts` lowers it.
    pub num_speculative_tokens: Option<usize>,
    /// Keep every verified slot's confidence and outcome (for calibration).
    pub record_confidence: bool,
    /// Admission and preemption.
    pub budget: Budget,
}

impl Default for EngineConfig {
    /// The scheduled policy ([`VerifyPolicy::ScheduledMeasured`]) over the drafter's whole
    /// block, the default budget.
    fn default() -> Self {
        Self {
            verify: VerifyPolicy::ScheduledMeasured,
            num_speculative_tokens: None,
            record_confidence: false,
            budget: Budget::default(),
        }
    }
}
