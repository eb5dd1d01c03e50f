//! One request's state in the engine: waiting for room ([`Waiting`]) or holding a row of the
//! target cache ([`Slot`]).

use candle_core::Tensor;

use crate::engine::output::{FinishReason, RequestError, RequestUsage};
use crate::engine::request::{RequestId, RequestSpec};

/// A request that is not running: new, or preempted (then `out` holds what it committed).
#[derive(Debug)]
pub(crate) struct Waiting {
    pub(crate) id: RequestId,
    pub(crate) spec: RequestSpec,
    /// Tokens committed before a preemption (empty for a new request).
    pub(crate) out: Vec<u32>,
    pub(crate) usage: RequestUsage,
}

impl Waiting {
    /// Tokens its prefill runs through the target: the prompt, and for a resumed request
    /// every committed token but the last (the anchor the next round starts from).
    pub(crate) fn prefill_tokens(&self) -> Vec<u32> {
        let mut t = self.spec.prompt.clone();
        if let Some((_, held)) = self.out.split_last() {
            t.extend_from_slice(held);
        }
        t
    }
}

/// A running request: row `i` of the target cache holds its tokens.
#[derive(Debug)]
pub(crate) struct Slot<S> {
    pub(crate) id: RequestId,
    pub(crate) spec: RequestSpec,
    /// Committed tokens (prompt excluded).
    pub(crate) out: Vec<u32>,
    /// Tokens the target cache row holds: the anchor (the last committed token) sits at this
    /// position.
    pub(crate) len: usize,
    /// The last committed token, not yet in the cache.
    pub(crate) anchor: u32,
    /// Its drafter context (`None` for a request that never drafts).
    pub(crate) state: Option<S>,
    /// The previous round's confidences (the pipelined policy's stale input, the prior of
    /// the drafting decision).
    pub(crate) stale: Option<Vec<f32>>,
    /// Target features of plain rounds not yet in its drafter context, and the position the
    /// first of them belongs at: appended in one call before its next proposal.
    pub(crate) pending: (usize, Vec<Tensor>),
    /// In the step it joins in: the tokens its prefill runs (set until the prefill is done).
    pub(crate) joining: Option<Vec<u32>>,
    /// Whether its prefill samples its first token (a new request) or resumes (`out` ends
    /// with its anchor).
    pub(crate) resumed: bool,
    /// Admission order: the newest running request is preempted first.
    pub(crate) admitted: u64,
    pub(crate) usage: RequestUsage,
    /// Set when it finished in the current step.
    pub(crate) finish: Option<FinishReason>,
    /// With [`FinishReason::Error`]: why.
    pub(crate) error: Option<RequestError>,
}

/// Rows held by a list of `[rows, H]` feature tensors (a slot's pending features).
pub(crate) fn feature_rows(parts: &[Tensor]) -> usize {
    parts.iter().map(|r| r.dim(0).unwrap_or(0)).sum()
}

impl<S> Slot<S> {
    /// Tokens it may still generate.
    pub(crate) fn budget_left(&self) -> usize {
        self.spec.max_new_tokens.saturating_sub(self.out.len())
    }

    /// Append `tokens` until its budget or one of its stop ids ends it; returns how many were
    /// kept.
    pub(crate) fn push(&mut self, tokens: &[u32]) -> usize {
        for (n, &t) in tokens.iter().enumerate() {
            self.out.push(t);
            self.usage.generated_tokens += 1;
            if self.spec.stop_token_ids.contains(&t) {
                self.finish = Some(FinishReason::Stop);
                return n + 1;
            }
            if self.out.len() >= self.spec.max_new_tokens {
                self.finish = Some(FinishReason::Length);
                return n + 1;
            }
        }
        tokens.len()
    }

    /// End it with `e` (its own rows failed a check); it commits nothing more. The first
    /// failure is the one reported.
    pub(crate) fn fail(&mut self, e: &crate::error::Error) {
        self.finish = Some(FinishReason::Error);
        if self.error.is_none() {
            self.error = Some(RequestError::of(e));
        }
    }

    /// Back to the waiting queue (preempted): its cache row and drafter context are dropped;
    /// it keeps what it committed.
    pub(crate) fn into_waiting(self) -> Waiting {
        let mut usage = self.usage;
        usage.preemptions += 1;
        Waiting {
            id: self.id,
            spec: self.spec,
            out: self.out,
            usage,
        }
    }
}
