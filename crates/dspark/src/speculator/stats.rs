//! What a generation did: acceptance and the time split.

use crate::engine::ConfidenceRecord;

/// Statistics of one [`Speculator::generate`](super::Speculator::generate) call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Speculative rounds (one batched draft + verify each).
    pub rounds: usize,
    /// Of [`Self::rounds`], those in which a scheduling policy drafted nothing: every active
    /// request took one target-only step (drafting was not worth its cost at that batch).
    pub plain_rounds: usize,
    /// Sum over requests of the rounds each took part in.
    pub request_rounds: usize,
    /// Tokens committed by rounds (accepted drafts + correction/bonus).
    pub committed_tokens: usize,
    /// Draft tokens sent to verification.
    pub drafted_tokens: usize,
    /// Draft tokens accepted.
    pub accepted_tokens: usize,
    /// Per draft position `k`: how often it was verified after all earlier drafts were
    /// accepted.
    pub position_attempts: Vec<usize>,
    /// Per draft position `k`: how often it was then accepted.
    pub position_accepts: Vec<usize>,
    /// Seconds in the drafter (proposals, context extension).
    pub drafter_seconds: f64,
    /// Seconds in target forwards.
    pub target_seconds: f64,
    /// Seconds in kernels and bookkeeping (verify lengths, verification, cache truncation).
    pub kernel_seconds: f64,
    /// Wall time of the call, the streaming callback excluded.
    pub total_seconds: f64,
    /// Of [`Self::total_seconds`], the time to first token: the prompts' prefill (and, when
    /// speculating, the drafter's first context extension), up to every request's first
    /// token. The rest is the decode phase.
    pub prefill_seconds: f64,
    /// Per verified slot, when [`SpeculatorOptions::record_confidence`](super::SpeculatorOptions)
    /// is set and the drafter has a confidence head.
    pub confidence_records: Vec<ConfidenceRecord>,
}

impl Stats {
    /// τ: mean tokens committed per request-round (accepted drafts + 1).
    pub fn acceptance_length(&self) -> f64 {
        if self.request_rounds == 0 {
            0.0
        } else {
            self.committed_tokens as f64 / self.request_rounds as f64
        }
    }

    /// Conditional acceptance rate of draft position `k` given positions `< k` were accepted
    /// (`NaN` where never attempted).
    pub fn per_position_acceptance(&self) -> Vec<f64> {
        self.position_accepts
            .iter()
            .zip(&self.position_attempts)
            .map(|(&a, &n)| {
                if n == 0 {
                    f64::NAN
                } else {
                    a as f64 / n as f64
                }
            })
            .collect()
    }

    /// Record one request-round: `verified` drafts sent, `accepted` accepted, `committed`
    /// tokens committed.
    pub(crate) fn record(&mut self, verified: usize, accepted: usize, committed: usize) {
        self.request_rounds += 1;
        self.committed_tokens += committed;
        self.drafted_tokens += verified;
        self.accepted_tokens += accepted;
        if self.position_attempts.len() < verified {
            self.position_attempts.resize(verified, 0);
            self.position_accepts.resize(verified, 0);
        }
        for k in 0..(accepted + 1).min(verified) {
            self.position_attempts[k] += 1;
            self.position_accepts[k] += usize::from(k < accepted);
        }
    }
}
