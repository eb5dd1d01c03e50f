//! The pipelined scheduler: capacity from stale confidences, then the top-K of current
//! survival.

use super::check_shape;
use super::early_stop::ranked;
use super::table::StepsPerSecond;
use crate::error::Result;

/// The pipelined variant: the capacity `K*` maximizes `Θ` over all prefixes of the STALE
/// survival ranking (global search, no early stop; ties → smaller `K*`), then the top-`K*` slots
/// by CURRENT survival are admitted. `stale` and `current` are both `[B·K]`.
///
/// Errors: `bad-shape` (either not `B·K` values), `too-large`.
pub fn schedule_pipelined(
    stale: &[f32],
    current: &[f32],
    batch: usize,
    slots: usize,
    sps: &StepsPerSecond,
) -> Result<Vec<usize>> {
    check_shape(stale, batch, slots, "stale")?;
    check_shape(current, batch, slots, "current")?;
    let mut tau = batch as f64;
    let (mut best, mut capacity) = (tau * sps.sps(batch), 0usize);
    for (n, (a, _, _)) in ranked(stale, batch, slots).into_iter().enumerate() {
        tau += a;
        let theta = tau * sps.sps(batch + n + 1);
        if theta > best {
            best = theta;
            capacity = n + 1;
        }
    }
    let mut lengths = vec![0; batch];
    for (_, r, _) in ranked(current, batch, slots).into_iter().take(capacity) {
        lengths[r] += 1;
    }
    Ok(lengths)
}
