//! How a [`Speculator`](super::Speculator) decodes: sampling, seeds, the verify-length policy,
//! and the requests it serves.

use crate::schedule::StepsPerSecond;

/// How many drafts of each request's block are verified per round.
#[derive(Debug, Clone, PartialEq)]
pub enum VerifyPolicy {
    /// Every draft (up to `num_speculative_tokens`).
    Full,
    /// Truncate before the first slot whose confidence is below the threshold (in `[0, 1]`).
    Threshold(f32),
    /// The paper's scheduler (Algorithm 1) over a steps-per-second table of the target's
    /// forward, with each round's measured cost outside it (drafting, kernels: the
    /// speculator's recent medians per request) added
    /// ([`StepsPerSecond::with_overhead`](crate::schedule::StepsPerSecond::with_overhead)),
    /// looking past a cliff in the table on the acceptance earlier rounds measured
    /// ([`schedule_lengths_ahead`](crate::schedule::schedule_lengths_ahead)).
    Scheduled(StepsPerSecond),
    /// `Scheduled` over a table measured on the target at first use
    /// ([`measure_steps_per_second`](super::measure_steps_per_second)), kept by the
    /// speculator and refined online by the timings of the forwards its rounds run: per token
    /// count the median of the latest, and their median ratio to the profile scaling the rest
    /// ([`Speculator::measured_steps_per_second`](super::Speculator::measured_steps_per_second)).
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
    /// Base of every random stream (requests without their own seed).
    pub seed: u64,
    /// The verify-length policy.
    pub verify: VerifyPolicy,
    /// Keep every verified slot's confidence and outcome in
    /// [`Stats::confidence_records`](super::Stats::confidence_records) (for calibration).
    pub record_confidence: bool,
}

impl Default for SpeculatorOptions {
    /// Greedy, full verification, seed 0.
    fn default() -> Self {
        Self {
            num_speculative_tokens: None,
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            seed: 0,
            verify: VerifyPolicy::Full,
            record_confidence: false,
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
    /// The request's own seed: its draws then depend only on `(seed, position)`, not on where
    /// it sits in the batch. `None`: `(options seed, batch index)`.
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

/// What a seed is used for (the `salt` of [`derive_seed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    /// The first token, sampled from the prefill's last row.
    Prefill = 0,
    /// A round's draft block.
    Draft = 1,
    /// A round's verification.
    Verify = 2,
}

/// One 63-bit seed per `(seed, request, position, use)`: an independent stream for every draw
/// (SplitMix64 finalizer over a weighted sum, all arithmetic mod 2⁶⁴). `dspark.derive_seeds` in
/// Python computes the same values.
pub fn derive_seed(seed: u64, request: u64, position: u64, salt: u64) -> u64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(request.wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add(position.wrapping_mul(0x94D0_49BB_1331_11EB))
        .wrapping_add(salt);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) & ((1 << 63) - 1)
}

#[cfg(test)]
mod tests {
    use super::derive_seed;

    #[test]
    fn derive_seed_matches_the_python_formula() {
        // Values from `dspark.speculator.derive_seeds` before the loop moved to the engine.
        assert_eq!(derive_seed(0, 0, 0, 0), 0);
        assert_eq!(derive_seed(1234, 0, 7, 2), 8421061507603747359);
        assert_eq!(derive_seed(1234, 1, 7, 2), 318230662786112393);
        assert_eq!(derive_seed(u64::MAX - 4, 3, 100, 1), 3670197831097064398);
    }
}
