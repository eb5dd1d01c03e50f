//! The policy room: how much a round verifies, and whether it drafts at all.
//!
//! Verify-length policies (how many of each request's drafts a round verifies): a static
//! confidence threshold, the paper's early-stop scheduler (Algorithm 1), the same with a
//! look-ahead on predicted acceptance, a batch-wide look-ahead, and the pipelined variant.
//!
//! Confidences are `[B·K]` row-major; `c_{r,j}` estimates P(draft `j` accepted | drafts `< j`
//! accepted). Values outside `[0, 1]` are clamped and NaN counts as `0` (never admitted early).
//! The slice must hold exactly `B·K` values (`bad-shape` otherwise), and the batch `B` is
//! bounded by [`crate::limits::MAX_BATCH`] (`too-large`), checked before anything is
//! allocated.
//!
//! Files:
//! - the policies: `verify_policy.rs` ([`VerifyPolicy`]), `threshold.rs`, `early_stop.rs`
//!   (Algorithm 1 and its look-ahead), `batch.rs` (the batch-wide look-ahead the engine runs),
//!   `pipelined.rs`;
//! - the cost model they maximise against: `table.rs` ([`StepsPerSecond`]); its prior,
//!   `prior.rs` (the table from the target's [`ForwardCost`](crate::models::ForwardCost) and
//!   this machine's speed, `machine.rs`: [`Machine`], measured once and cached); and
//!   `profile.rs` ([`measure_steps_per_second`], the table timed on a target, when asked);
//! - what a serving engine learns and decides with them: `acceptance.rs` (acceptance per
//!   draft position), `learned.rs` (forward timings, round costs) and `planner/` (the
//!   engine's policy state and its two choices per round: plain, drafted or a probe; how many
//!   drafts each request verifies).
//!
//! A new verify-length policy is a variant of [`VerifyPolicy`], its function here, and its
//! arm in the planner's `verify_lengths`.

mod acceptance;
mod batch;
mod early_stop;
mod learned;
mod machine;
mod pipelined;
mod planner;
mod prior;
mod profile;
mod round_costs;
pub(crate) mod table;
mod threshold;
mod verify_policy;
mod weigh;

pub use batch::{MAX_BATCH_SEARCH_SLOTS, schedule_lengths_batch};
pub use early_stop::{schedule_lengths, schedule_lengths_ahead};
pub use machine::{Machine, cache_dir};
pub use pipelined::schedule_pipelined;
pub(crate) use planner::{Drafting, Planner};
pub use planner::{EXPLORE_SHARE, REFRESH_ROUNDS, REFRESH_ROUNDS_MAX};
pub use profile::{MAX_PROFILE_TOKENS, measure_steps_per_second};
pub use table::StepsPerSecond;
pub use threshold::threshold_lengths;
pub use verify_policy::VerifyPolicy;
pub use weigh::PLAIN_MARGIN;

use crate::error::{Error, Result};
use crate::limits::{MAX_BATCH, at_most};

/// Validate a `[B·K]` confidence slice named `name`: the exact length, and a bounded `[B]`
/// output.
pub(crate) fn check_shape(
    confidence: &[f32],
    batch: usize,
    slots: usize,
    name: &str,
) -> Result<()> {
    at_most(name, batch as u64, MAX_BATCH)?;
    if batch.checked_mul(slots) != Some(confidence.len()) {
        return Err(Error::bad_shape(
            name,
            format!(
                "{} values for [B, K] = [{batch}, {slots}] (need B·K = {})",
                confidence.len(),
                batch.saturating_mul(slots)
            ),
        ));
    }
    Ok(())
}

pub(crate) fn conf(c: &[f32], i: usize) -> f64 {
    match c.get(i) {
        Some(&v) if v > 0.0 => f64::from(v.min(1.0)),
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sps_lookup_modes() {
        let s = StepsPerSecond::step(vec![(1, 20.0), (4, 10.0), (8, 5.0)]).unwrap();
        assert_eq!(s.sps(1), 20.0);
        assert_eq!(s.sps(2), 10.0);
        assert_eq!(s.sps(8), 5.0);
        assert_eq!(s.sps(16), 2.5);
        let l = StepsPerSecond::linear(vec![(1, 20.0), (5, 10.0)]).unwrap();
        assert_eq!(l.sps(3), 15.0);
        let code = |r: Result<StepsPerSecond>| r.unwrap_err().code();
        for bad in [
            vec![],
            vec![(1, 1.0)],
            vec![(1, 1.0), (1, 2.0)],
            vec![(4, 10.0), (1, 20.0)],
            vec![(1, f64::NAN), (2, 1.0)],
            vec![(1, 1.0), (2, 0.0)],
            vec![(0, 1.0), (2, 1.0)],
            vec![(1, 1.0), (2, f64::INFINITY)],
        ] {
            assert_eq!(code(StepsPerSecond::step(bad.clone())), "invalid-argument");
            assert_eq!(code(StepsPerSecond::linear(bad)), "invalid-argument");
        }
    }

    #[test]
    fn overhead_makes_longer_verification_pay() {
        // Verifying 4 tokens costs 2x one token: with survival 0.6, 0.36, 0.2 the scheduler
        // stops early on the bare table, and admits more once a round also pays a fixed
        // drafting cost as large as the one-token verify.
        let s = StepsPerSecond::linear(vec![(1, 100.0), (4, 50.0)]).unwrap();
        let c = [0.6, 0.6, 0.55];
        let bare = schedule_lengths(&c, 1, 3, &s).unwrap();
        let with = s.with_overhead(0.01);
        assert!((with.sps(1) - 50.0).abs() < 1e-9 && (with.sps(4) - 100.0 / 3.0).abs() < 1e-9);
        let longer = schedule_lengths(&c, 1, 3, &with).unwrap();
        assert!(longer[0] > bare[0], "{bare:?} vs {longer:?}");
        assert_eq!(s.with_overhead(f64::NAN), s);
        assert_eq!(s.with_overhead(0.0), s);
    }

    #[test]
    fn threshold_cuts_before_the_first_low_slot() {
        let c = [
            0.9,
            0.8,
            0.2,
            0.9,
            0.1,
            0.9,
            0.9,
            0.9,
            f32::NAN,
            0.9,
            0.9,
            0.9,
        ];
        assert_eq!(threshold_lengths(&c, 3, 4, 0.5).unwrap(), vec![2, 0, 0]);
        assert_eq!(threshold_lengths(&c[..8], 2, 4, 0.05).unwrap(), vec![4, 4]);
    }

    #[test]
    fn shapes_are_exact_and_outputs_bounded() {
        let sps = StepsPerSecond::step(vec![(1, 10.0), (2, 5.0)]).unwrap();
        let code = |r: Result<Vec<usize>>| r.unwrap_err().code();
        // A short slice is refused, never read as zeros.
        assert_eq!(code(threshold_lengths(&[0.9; 3], 2, 2, 0.5)), "bad-shape");
        assert_eq!(code(schedule_lengths(&[0.9; 5], 2, 2, &sps)), "bad-shape");
        assert_eq!(
            code(schedule_pipelined(&[0.9; 4], &[0.9; 3], 2, 2, &sps)),
            "bad-shape"
        );
        // Zero-size input with one huge dimension: refused before allocating `[B]`.
        assert_eq!(code(threshold_lengths(&[], 1 << 40, 0, 0.5)), "too-large");
        assert_eq!(code(schedule_lengths(&[], 1 << 40, 0, &sps)), "too-large");
        assert_eq!(
            code(schedule_pipelined(&[], &[], 1 << 40, 0, &sps)),
            "too-large"
        );
        // ... while a huge K with B = 0 is simply empty.
        assert_eq!(
            threshold_lengths(&[], 0, 1 << 40, 0.5).unwrap(),
            Vec::<usize>::new()
        );
        assert_eq!(
            code(threshold_lengths(&[0.5], 1, 1, f32::NAN)),
            "invalid-argument"
        );
    }
}
