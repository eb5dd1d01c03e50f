//! The paper's scheduler (Algorithm 1): sort prefix survival products, admit slots while the
//! expected accepted tokens × steps per second strictly improves, stop at the first
//! non-improvement (the early stop keeps verification lossless); and the same with a
//! look-ahead on acceptance predicted without the current draws.

use super::table::StepsPerSecond;
use super::{check_shape, conf};
use crate::error::Result;

/// Survival products `a_{r,j} = Π_{i<=j} c_{r,i}` with their (r, j), sorted by survival
/// descending (ties: lower r, then lower j — so each request's slots stay in prefix order).
pub(crate) fn ranked(confidence: &[f32], batch: usize, slots: usize) -> Vec<(f64, usize, usize)> {
    let mut v = Vec::with_capacity(batch * slots);
    for r in 0..batch {
        let mut a = 1.0;
        for j in 0..slots {
            a *= conf(confidence, r * slots + j);
            v.push((a, r, j));
        }
    }
    v.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
    v
}

/// The paper's scheduler: admit slots by descending survival while `Θ = τ·SPS(B)` strictly
/// improves, stopping at the first non-improvement (the early stop keeps it lossless).
///
/// Errors: `bad-shape` (not `B·K` values), `too-large`.
pub fn schedule_lengths(
    confidence: &[f32],
    batch: usize,
    slots: usize,
    sps: &StepsPerSecond,
) -> Result<Vec<usize>> {
    check_shape(confidence, batch, slots, "confidence")?;
    Ok(scan(confidence, batch, slots, sps, None))
}

/// The paper's scheduler with a look-ahead that cannot anticipate the current draws.
///
/// Algorithm 1's early stop cannot cross a cliff in the table: where one more verified token
/// costs a step (a kernel's row tile, a CUDA-graph size), the first slot past it lowers `Θ`
/// even when the slots after it would more than repay it, and the scan stops. Here a slot
/// `(r, j)`, taken in the same survival order, is also admitted when `Θ` strictly improves
/// with it and its request's next `m` slots for some `m`, those priced with `ahead` (`[B·K]`,
/// like `confidence`): per request and position, the acceptance predicted WITHOUT this
/// round's draws (`ahead[r·K + i]` ≈ P(slot `i` accepted | slots `< i` accepted), e.g. from
/// earlier rounds), so the continuation's survival is `a_{r,j}·Π ahead[r·K + j+1..=j+m]`. The
/// scan stops at the first slot admitted neither way.
///
/// Lossless as the early stop is: whether slot `(r, j)` is verified depends on the survivals
/// ranked before it, its own `a_{r,j}` (drafts before `j`: `c_j` reads `x_{<j}`) and `ahead`,
/// never on a draw the verification of `(r, j)` could condition. `ahead` all zero is
/// [`schedule_lengths`]. Values are read as confidences are (clamped to `[0, 1]`, NaN as 0).
///
/// Errors: `bad-shape` (`confidence` or `ahead` not `B·K` values), `too-large`.
pub fn schedule_lengths_ahead(
    confidence: &[f32],
    batch: usize,
    slots: usize,
    sps: &StepsPerSecond,
    ahead: &[f32],
) -> Result<Vec<usize>> {
    check_shape(confidence, batch, slots, "confidence")?;
    check_shape(ahead, batch, slots, "ahead")?;
    Ok(scan(confidence, batch, slots, sps, Some(ahead)))
}

/// Algorithm 1's scan (shapes checked): admit ranked slots while `Θ` strictly improves, or,
/// with `ahead`, while it would with the slot's predicted continuation.
pub(super) fn scan(
    confidence: &[f32],
    batch: usize,
    slots: usize,
    sps: &StepsPerSecond,
    ahead: Option<&[f32]>,
) -> Vec<usize> {
    let mut lengths = vec![0; batch];
    let mut tau = batch as f64;
    let mut theta = tau * sps.sps(batch);
    // Admitting the n-th slot (n from 1) makes the batch `batch + n` tokens.
    for (tokens, (a, r, j)) in (batch + 1..).zip(ranked(confidence, batch, slots)) {
        let next = (tau + a) * sps.sps(tokens);
        let pays = next > theta
            || ahead.is_some_and(|ahead| {
                // The request's continuation past `j`, on predicted acceptance.
                let (mut t, mut s) = (tau + a, a);
                // A continuation predicted to fail adds nothing worth verifying.
                (j + 1..slots).zip(tokens + 1..).any(|(i, n)| {
                    s *= conf(ahead, r * slots + i);
                    t += s;
                    s > 0.0 && t * sps.sps(n) > theta
                })
            });
        if !pays {
            break;
        }
        theta = next;
        tau += a;
        lengths[r] += 1;
    }
    lengths
}
