//! Steps per second as a function of the tokens one target forward verifies: the cost model
//! of the schedulers.

use crate::error::{Error, Result};

/// Steps per second of a verify pass as a function of the total number of verified tokens,
/// profiled once at engine start.
#[derive(Debug, Clone, PartialEq)]
pub struct StepsPerSecond {
    /// `(tokens, steps/s)`, tokens strictly increasing, at least two entries.
    points: Vec<(usize, f64)>,
    /// Step function (`true`) or linear interpolation.
    step: bool,
}

impl StepsPerSecond {
    fn build(points: Vec<(usize, f64)>, step: bool) -> Result<Self> {
        let bad = |why: String| Error::invalid("steps_per_second", why);
        if points.len() < 2 {
            return Err(bad(format!(
                "{} entries: a table needs at least two (tokens, steps/s) pairs",
                points.len()
            )));
        }
        for w in points.windows(2) {
            if w[0].0 >= w[1].0 {
                return Err(bad(format!(
                    "{} tokens after {}: token counts must strictly increase",
                    w[1].0, w[0].0
                )));
            }
        }
        if let Some(&(n, v)) = points
            .iter()
            .find(|p| !(p.1.is_finite() && p.1 > 0.0) || p.0 == 0)
        {
            return Err(bad(format!(
                "entry ({n} tokens, {v}): tokens must be >= 1, steps/s finite and > 0"
            )));
        }
        Ok(StepsPerSecond { points, step })
    }

    /// A step function over profiled sizes (e.g. CUDA-graph capture sizes): `SPS(n)` is the value
    /// at the smallest profiled size `>= n`.
    ///
    /// Errors (`invalid-argument`): fewer than two entries, token counts that do not strictly
    /// increase, a count of 0, or steps/s that are not finite and positive.
    pub fn step(points: Vec<(usize, f64)>) -> Result<Self> {
        Self::build(points, true)
    }

    /// Piecewise-linear interpolation between profiled sizes (constant below the first).
    ///
    /// Errors: as [`StepsPerSecond::step`].
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

/// The lower median of timings (`None` for an empty slice): the statistic the profile and its
/// online refinement price the table with.
pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[(v.len() - 1) / 2])
}
