//! [`VerifyPolicy`]: which of the policies of this module a round uses.

use super::StepsPerSecond;

/// How many drafts of each request's block are verified per round.
#[derive(Debug, Clone, PartialEq)]
pub enum VerifyPolicy {
    /// Every draft (up to `num_speculative_tokens`).
    Full,
    /// Truncate before the first slot whose confidence is below the threshold (in `[0, 1]`).
    Threshold(f32),
    /// The paper's scheduler (Algorithm 1) over a steps-per-second table of the target's
    /// forward, with each round's measured cost outside it (drafting, kernels: the
    /// engine's recent medians per request) added
    /// ([`StepsPerSecond::with_overhead`](super::StepsPerSecond::with_overhead)),
    /// looking past a cliff in the table over the whole batch: the other requests' slots and
    /// the request's own continuation on the acceptance earlier rounds measured
    /// ([`schedule_lengths_batch`](super::schedule_lengths_batch)).
    Scheduled(StepsPerSecond),
    /// `Scheduled` over a table the engine keeps and refines online, needing no profile: a
    /// prior from the target's shape and this machine's speed
    /// ([`ForwardCost`](crate::models::ForwardCost), [`Machine`](crate::policy::Machine)),
    /// rescaled by the timings of the forwards its rounds run and, per token count, priced by
    /// the median of the latest ones
    /// ([`Engine::measured_steps_per_second`](crate::engine::Engine::measured_steps_per_second)).
    /// `warm_up` replaces the prior with a profile timed on the target
    /// ([`measure_steps_per_second`](crate::policy::measure_steps_per_second)), only when
    /// called. The default policy.
    ScheduledMeasured,
    /// The pipelined variant: the capacity from the previous round's (stale) confidences, then
    /// the top slots by current survival (the table priced as for `Scheduled`).
    Pipelined(StepsPerSecond),
}

impl VerifyPolicy {
    /// `"full"`, `"threshold"` or `"scheduled"`.
    pub fn name(&self) -> &'static str {
        match self {
            VerifyPolicy::Full => "full",
            VerifyPolicy::Threshold(_) => "threshold",
            VerifyPolicy::Scheduled(_) | VerifyPolicy::ScheduledMeasured => "scheduled",
            VerifyPolicy::Pipelined(_) => "pipelined",
        }
    }
}
