//! Verify-length policies: a static confidence threshold, the paper's early-stop scheduler
//! (Algorithm 1), the same with a look-ahead on predicted acceptance, and the pipelined variant.
//!
//! Confidences are `[B·K]` row-major; `c_{r,j}` estimates P(draft `j` accepted | drafts `< j`
//! accepted). Values outside `[0, 1]` are clamped and NaN counts as `0` (never admitted early).
//! The slice must hold exactly `B·K` values (`bad-shape` otherwise), and the batch `B` is
//! bounded by [`crate::limits::MAX_BATCH`] (`too-large`), checked before anything is
//! allocated.

use crate::error::{Error, Result};
use crate::limits::{MAX_BATCH, at_most};

/// Validate a `[B·K]` confidence slice named `name`: the exact length, and a bounded `[B]`
/// output.
fn check_shape(confidence: &[f32], batch: usize, slots: usize, name: &str) -> Result<()> {
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

fn conf(c: &[f32], i: usize) -> f64 {
    match c.get(i) {
        Some(&v) if v > 0.0 => f64::from(v.min(1.0)),
        _ => 0.0,
    }
}

/// Truncate each request before its first slot with `c < threshold`.
///
/// Errors: `bad-shape` (not `B·K` values), `too-large`, `invalid-argument` (a NaN threshold).
pub fn threshold_lengths(
    confidence: &[f32],
    batch: usize,
    slots: usize,
    threshold: f32,
) -> Result<Vec<usize>> {
    check_shape(confidence, batch, slots, "confidence")?;
    if threshold.is_nan() {
        return Err(Error::invalid("threshold", "NaN"));
    }
    Ok((0..batch)
        .map(|r| {
            (0..slots)
                .position(|j| !matches!(confidence.get(r * slots + j), Some(&c) if c >= threshold))
                .unwrap_or(slots)
        })
        .collect())
}

/// Steps per second of a verify pass as a function of the total number of verified tokens,
/// profiled once at engine start.
#[derive(Debug, Clone, PartialEq)]
pub struct StepsPerSecond {
    /// `(tokens, steps/s)`, tokens strictly increasing.
    points: Vec<(usize, f64)>,
    /// Step function (`true`) or linear interpolation.
    step: bool,
}

impl StepsPerSecond {
    fn build(mut points: Vec<(usize, f64)>, step: bool) -> Result<Self> {
        if points.is_empty() {
            return Err(Error::invalid("steps_per_second", "the table is empty"));
        }
        points.sort_by_key(|p| p.0);
        for w in points.windows(2) {
            if w[0].0 == w[1].0 {
                return Err(Error::invalid(
                    "steps_per_second",
                    format!("two entries for {} tokens", w[0].0),
                ));
            }
        }
        if let Some(&(n, v)) = points
            .iter()
            .find(|p| !(p.1.is_finite() && p.1 > 0.0) || p.0 == 0)
        {
            return Err(Error::invalid(
                "steps_per_second",
                format!("entry ({n} tokens, {v}): tokens must be >= 1, steps/s finite and > 0"),
            ));
        }
        Ok(StepsPerSecond { points, step })
    }

    /// A step function over profiled sizes (e.g. CUDA-graph capture sizes): `SPS(n)` is the value
    /// at the smallest profiled size `>= n`.
    pub fn step(points: Vec<(usize, f64)>) -> Result<Self> {
        Self::build(points, true)
    }

    /// Piecewise-linear interpolation between profiled sizes (constant below the first).
    pub fn linear(points: Vec<(usize, f64)>) -> Result<Self> {
        Self::build(points, false)
    }

    /// The table of whole rounds that also spend `seconds` outside the verify pass (drafting,
    /// kernels): `SPS'(n) = 1 / (1/SPS(n) + seconds)`. The scheduler's objective `τ·SPS'` is
    /// then tokens per second of the round, so a fixed per-round cost weighs in favour of
    /// verifying more (fewer rounds). A non-finite or non-positive `seconds` leaves the table.
    pub fn with_overhead(&self, seconds: f64) -> Self {
        if !(seconds.is_finite() && seconds > 0.0) {
            return self.clone();
        }
        let points = self
            .points
            .iter()
            .map(|&(n, v)| (n, 1.0 / (1.0 / v + seconds)))
            .collect();
        StepsPerSecond {
            points,
            step: self.step,
        }
    }

    /// The `(tokens, steps/s)` entries, tokens increasing.
    pub fn points(&self) -> &[(usize, f64)] {
        &self.points
    }

    /// A table over `points`, read the way this one is (step or linear).
    ///
    /// Errors: as [`StepsPerSecond::linear`].
    pub fn with_points(&self, points: Vec<(usize, f64)>) -> Result<Self> {
        Self::build(points, self.step)
    }

    /// `SPS(n)`. Past the last profiled size `N`, tokens/s is held constant:
    /// `SPS(n) = SPS(N)·N/n`.
    pub fn sps(&self, tokens: usize) -> f64 {
        let pts = &self.points;
        let (ln, lv) = pts[pts.len() - 1];
        if tokens > ln {
            return lv * ln as f64 / tokens as f64;
        }
        let i = pts.partition_point(|p| p.0 < tokens);
        if self.step || i == 0 || pts[i].0 == tokens {
            return pts[i].1;
        }
        let (a, b) = (pts[i - 1], pts[i]);
        let f = (tokens - a.0) as f64 / (b.0 - a.0) as f64;
        a.1 + f * (b.1 - a.1)
    }
}

/// Survival products `a_{r,j} = Π_{i<=j} c_{r,i}` with their (r, j), sorted by survival
/// descending (ties: lower r, then lower j — so each request's slots stay in prefix order).
fn ranked(confidence: &[f32], batch: usize, slots: usize) -> Vec<(f64, usize, usize)> {
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
fn scan(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sps_lookup_modes() {
        let s = StepsPerSecond::step(vec![(4, 10.0), (1, 20.0), (8, 5.0)]).unwrap();
        assert_eq!(s.sps(1), 20.0);
        assert_eq!(s.sps(2), 10.0);
        assert_eq!(s.sps(8), 5.0);
        assert_eq!(s.sps(16), 2.5);
        let l = StepsPerSecond::linear(vec![(1, 20.0), (5, 10.0)]).unwrap();
        assert_eq!(l.sps(3), 15.0);
        assert!(StepsPerSecond::step(vec![]).is_err());
        assert!(StepsPerSecond::step(vec![(1, 1.0), (1, 2.0)]).is_err());
        assert!(StepsPerSecond::step(vec![(1, f64::NAN)]).is_err());
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
        let sps = StepsPerSecond::step(vec![(1, 10.0)]).unwrap();
        let code = |r: Result<Vec<usize>>| r.unwrap_err().code();
        // A short slice is no longer read as zeros.
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
