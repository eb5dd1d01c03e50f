//! Counters over the engine's lifetime, named after vLLM's speculative-decoding metrics
//! (`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`,
//! `..._num_accepted_tokens_per_pos`, `vllm:num_requests_running` / `_waiting`,
//! `vllm:num_preemptions`, `vllm:prompt_tokens`, `vllm:generation_tokens`).

/// A snapshot of the engine's counters (monotone since construction, except the gauges).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EngineMetrics {
    /// Gauge: requests in the running batch.
    pub requests_running: usize,
    /// Gauge: requests admitted but waiting (new, or preempted) for room.
    pub requests_waiting: usize,
    /// Gauge: KV cache tokens held by running requests.
    pub kv_tokens_used: usize,
    /// The KV budget in tokens (`None`: unbounded).
    pub kv_tokens_capacity: Option<usize>,
    /// Steps run.
    pub steps: u64,
    /// Requests added.
    pub requests_added: u64,
    /// Requests finished by a stop id.
    pub requests_stopped: u64,
    /// Requests finished by their length budget.
    pub requests_length: u64,
    /// Requests aborted.
    pub requests_aborted: u64,
    /// Requests that ended with an error of their own (their rows failed a check).
    pub requests_failed: u64,
    /// Preemptions (a running request's cache dropped for room; it resumes later).
    pub preemptions: u64,
    /// Prompt tokens prefilled (a resumed request's re-prefill not counted again).
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generation_tokens: u64,
    /// Drafted request-rounds: one per request per round whose block was verified.
    pub num_drafts: u64,
    /// Draft tokens sent to verification.
    pub num_draft_tokens: u64,
    /// Of those, accepted.
    pub num_accepted_tokens: u64,
    /// Per draft position `k`: how often the draft at `k` was accepted.
    pub num_accepted_tokens_per_pos: Vec<u64>,
}

impl EngineMetrics {
    /// Mean accepted drafts per drafted request-round, plus one: τ over the engine's lifetime.
    pub fn mean_acceptance_length(&self) -> f64 {
        if self.num_drafts == 0 {
            0.0
        } else {
            1.0 + self.num_accepted_tokens as f64 / self.num_drafts as f64
        }
    }
}
