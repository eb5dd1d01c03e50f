//! How many drafts each request of a drafted round verifies, under the policy in use.

use super::Planner;
use crate::error::Result;
use crate::models::TargetModel;
use crate::policy::acceptance::unit;
use crate::policy::weigh::stale_of;
use crate::policy::{
    StepsPerSecond, VerifyPolicy, schedule_lengths_batch, schedule_pipelined, threshold_lengths,
};

impl Planner {
    /// Per request and draft position `k < n` (`[B·n]`), the acceptance expected before this
    /// round's draws: the measured rate at `k`, with the request's previous-round confidence
    /// counted as a prior (1/2 without one). The survival the drafting decision weighs, and
    /// the scheduler's look-ahead (never this round's confidences: lossless).
    pub(super) fn expected_acceptance(&self, stale: &[Option<&[f32]>], n: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(stale.len() * n);
        for r in 0..stale.len() {
            match stale_of(stale, r, n) {
                Some(s) => out.extend(
                    s.iter()
                        .enumerate()
                        .map(|(k, &c)| self.acceptance.expected(k, unit(c))),
                ),
                None => out.extend((0..n).map(|k| self.acceptance.expected(k, 0.5))),
            }
        }
        out
    }

    /// Drafts to verify per drafting request over blocks of `k`: the policy's choice (capped
    /// later by each request's own limit). `confidence`: this round's, `[B·n]` with
    /// `n = min(num_speculative, k)` (`None` when a request has none); `stale`: each request's
    /// previous-round confidences. Returns the lengths and, when the policy read this round's
    /// confidences, what each request keeps as its next `stale` (`[B·n]`).
    pub(crate) fn verify_lengths<T: TargetModel>(
        &mut self,
        target: &T,
        confidence: Option<Vec<f32>>,
        stale: &[Option<&[f32]>],
        k: usize,
        measured: Option<&StepsPerSecond>,
    ) -> Result<(Vec<usize>, Option<Vec<f32>>)> {
        let n = self.num_speculative.min(k);
        let b = stale.len();
        let (policy, raw) = match (&self.verify, confidence) {
            (VerifyPolicy::Full, _) | (_, None) => return Ok((vec![n; b], None)),
            (policy, Some(c)) => (policy.clone(), c),
        };
        // The schedulers read survival: each confidence rescaled by how its position's
        // predictions have fared (the threshold keeps the raw values).
        let firsts = match policy {
            VerifyPolicy::Threshold(_) => raw,
            _ => self.acceptance.recalibrated(&raw, n),
        };
        // What a drafted round of this batch spends outside the target forward (proposing,
        // kernels, the context extension), from the rounds observed so far: a round pays it
        // whatever it verifies, so the scheduler weighs each table entry with it.
        let outside = self
            .round_costs(b)
            .map(|c| b as f64 * (c.propose + c.drafted_rest));
        let priced = |sps: &StepsPerSecond| match outside {
            Some(secs) => sps.with_overhead(secs),
            None => sps.clone(),
        };
        // The scheduler looks past a cliff in the table over the whole batch: the other
        // requests' slots, and each request's own continuation on the acceptance expected
        // from earlier rounds (never from its own draws of this round: lossless).
        let ahead = self.expected_acceptance(stale, n);
        let lens = match &policy {
            VerifyPolicy::Threshold(t) => threshold_lengths(&firsts, b, n, *t)?,
            VerifyPolicy::Scheduled(sps) => {
                schedule_lengths_batch(&firsts, b, n, &priced(sps), &ahead)?
            }
            VerifyPolicy::ScheduledMeasured => {
                let sps = match measured {
                    Some(t) => t.clone(),
                    None => self.measured_table(target, b * (n + 1), n + 1)?,
                };
                schedule_lengths_batch(&firsts, b, n, &priced(&sps), &ahead)?
            }
            VerifyPolicy::Pipelined(sps) => {
                // A request's previous-round confidences (its own current ones in its first
                // round) size the batch; current survival fills it.
                let older: Vec<f32> = (0..b)
                    .flat_map(|r| match stale_of(stale, r, n) {
                        Some(s) => s.to_vec(),
                        None => firsts[r * n..(r + 1) * n].to_vec(),
                    })
                    .collect();
                schedule_pipelined(&older, &firsts, b, n, &priced(sps))?
            }
            VerifyPolicy::Full => vec![n; b],
        };
        Ok((lens, Some(firsts)))
    }
}
