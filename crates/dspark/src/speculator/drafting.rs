//! Whether a round drafts at all, and the round that does not (see the module docs of
//! [`crate::speculator`]).
//!
//! The paper's scheduler chooses how many drafts each request verifies, for a round whose
//! drafting is already paid. Over a batch on a compute-bound target the best choice can be no
//! draft at all, and then the proposal itself was the waste. Before proposing, a scheduling
//! policy weighs the two rounds it can run with the same objective `Θ = E[tokens] · SPS'`:
//! - drafted: the scheduler's lengths over each request's expected acceptance (the call's
//!   measured per-position acceptance, its latest confidences weighing in as a prior), the
//!   table priced with the measured cost of proposing and of the rest of a drafted round;
//! - plain: one token per request, the table priced with the rest of a plain round.
//!
//! It drafts unless the best drafted round verifies nothing or the plain round is faster by
//! more than [`PLAIN_MARGIN`]: a plain round teaches nothing (no confidences, no acceptance),
//! the switch has costs the model prices only on average (the deferred extension, a refresh
//! round), and near a tie the estimates' noise would decide. The costs are the speculator's
//! recent medians per request at the nearest batch size (module `observed`; the batch shrinks
//! as requests finish). A request without confidences yet forces a drafted round, and so does
//! a streak of plain rounds (which add no
//! confidences): 1 plain round after drafting stopped paying, then 2, 4… up to
//! [`REFRESH_ROUNDS`] (back to 1 whenever drafting pays again), so an early misjudgement
//! costs a round or two while a batch where drafting never pays drafts once in 17 rounds.
//! A plain round is exactly a target-only step (same seeds, so greedy output is unchanged and
//! sampling stays exact); its features extend the drafter's context like any committed token,
//! in one call before the request's next proposal.

use std::time::Instant;

use super::observed::Costs;
use super::options::VerifyPolicy;
use super::run::Speculator;
use super::state::Run;
use super::target::TargetModel;
use crate::drafter::Drafter;
use crate::error::Result;
use crate::schedule::{StepsPerSecond, schedule_lengths_ahead};

/// Most plain rounds in a row before a round drafts again, to refresh the confidences the
/// choice is made from.
pub const REFRESH_ROUNDS: usize = 16;

/// Observations a request's latest confidence counts as, against the call's measured
/// acceptance at the same position.
const PRIOR: f64 = 4.0;

/// How much faster (relative) a plain round must be expected to run than the best drafted
/// round before a round skips drafting.
pub const PLAIN_MARGIN: f64 = 0.1;

/// A confidence as a probability: clamped to `[0, 1]`, NaN as `0` (as the schedulers read it).
pub(super) fn unit(c: f32) -> f64 {
    if c.is_nan() {
        0.0
    } else {
        f64::from(c.clamp(0.0, 1.0))
    }
}

/// `c` (`[B·n]` confidences) rescaled per position by this call's record there:
/// `c·(accepted + PRIOR) / (predicted + PRIOR)`, clamped to `[0, 1]`. A head that is right on
/// average leaves it as it is; on text easier (or harder) than the head's training data the
/// scheduler reads the acceptance it actually sees, and each request keeps its own ranking.
pub(super) fn recalibrated<T: TargetModel>(c: &[f32], n: usize, run: &Run<'_, T>) -> Vec<f32> {
    let st = &run.stats;
    let scale: Vec<f64> = (0..n)
        .map(|k| {
            let accepted = st.position_accepts.get(k).copied().unwrap_or(0) as f64;
            let predicted = run.predicted.get(k).copied().unwrap_or(0.0);
            (accepted + PRIOR) / (predicted + PRIOR)
        })
        .collect();
    c.iter()
        .enumerate()
        .map(|(i, &x)| (unit(x) * scale[i % n]).min(1.0) as f32)
        .collect()
}

/// Per active request and draft position `k < n` (`[B·n]`), the acceptance expected before
/// this round's draws: the call's measured rate at `k`, with the request's previous-round
/// confidence there counted as [`PRIOR`] observations (1/2 for a request without one). One
/// hard round must not stop drafting for a request whose text is mostly easy, and a position
/// never verified yet is read as its head predicts. The survival `drafts_this_round` weighs,
/// and the look-ahead of [`schedule_lengths_ahead`] (never this round's confidences: lossless).
pub(super) fn expected_acceptance<T: TargetModel>(
    run: &Run<'_, T>,
    act: &[usize],
    n: usize,
) -> Vec<f32> {
    let st = &run.stats;
    let rate = |k: usize, c: f64| {
        let accepts = st.position_accepts.get(k).copied().unwrap_or(0) as f64;
        let attempts = st.position_attempts.get(k).copied().unwrap_or(0) as f64;
        ((accepts + PRIOR * c) / (attempts + PRIOR)) as f32
    };
    let mut out = Vec::with_capacity(act.len() * n);
    for &i in act {
        match &run.stale[i] {
            Some(s) if s.len() == n => {
                out.extend(s.iter().enumerate().map(|(k, &c)| rate(k, unit(c))));
            }
            _ => out.extend((0..n).map(|k| rate(k, 0.5))),
        }
    }
    out
}

/// Expected tokens a round commits when request `r` verifies `lens[r]` of its `n` drafts
/// with confidences `c` (`[B·n]`): one each, plus the survival of every verified slot.
fn expected_tokens(c: &[f32], n: usize, lens: &[usize]) -> f64 {
    let mut tau = lens.len() as f64;
    for (r, &len) in lens.iter().enumerate() {
        let mut a = 1.0;
        for &x in &c[r * n..r * n + len] {
            a *= unit(x);
            tau += a;
        }
    }
    tau
}

/// Whether drafting beats a plain round for a batch of `b` requests whose latest confidences
/// are `stale` (`[B·n]`), given the table `sps`, the per-request costs outside the forward and
/// the scheduler's look-ahead `ahead` (`[B·n]`).
pub(super) fn drafting_pays(
    stale: &[f32],
    b: usize,
    n: usize,
    sps: &StepsPerSecond,
    costs: Costs,
    ahead: &[f32],
) -> Result<bool> {
    let bf = b as f64;
    let drafted = sps.with_overhead(bf * (costs.propose + costs.drafted_rest));
    let lens = schedule_lengths_ahead(stale, b, n, &drafted, ahead)?;
    let verified = b + lens.iter().sum::<usize>();
    let theta_drafted = expected_tokens(stale, n, &lens) * drafted.sps(verified);
    let theta_plain = bf * sps.with_overhead(bf * costs.plain_rest).sps(b);
    // A drafted round that would verify nothing is a plain round that also proposed.
    Ok(verified > b && theta_plain <= (1.0 + PLAIN_MARGIN) * theta_drafted)
}

impl<T: TargetModel, D: Drafter> Speculator<T, D> {
    /// Whether this round of the active requests `act` drafts (see the module docs).
    /// `measured`: this round's measured table (under `ScheduledMeasured`).
    pub(super) fn drafts_this_round(
        &self,
        run: &mut Run<'_, T>,
        act: &[usize],
        measured: Option<&StepsPerSecond>,
    ) -> Result<bool> {
        let n = self.num_speculative_tokens();
        let b = act.len();
        let table = match &self.options().verify {
            VerifyPolicy::Scheduled(s) | VerifyPolicy::Pipelined(s) => s.clone(),
            VerifyPolicy::ScheduledMeasured => match measured {
                Some(t) => t.clone(),
                None => return Ok(true),
            },
            VerifyPolicy::Full | VerifyPolicy::Threshold(_) => return Ok(true),
        };
        if n == 0 {
            return Ok(true);
        }
        if run.since_draft >= run.refresh_after {
            // A refresh: if drafting still does not pay after it, the next streak is longer.
            run.refresh_after = (run.refresh_after * 2).min(REFRESH_ROUNDS);
            return Ok(true);
        }
        let Some(costs) = self.round_costs(b)? else {
            return Ok(true);
        };
        // A request without confidences yet drafts: it has nothing to be judged on.
        if act
            .iter()
            .any(|&i| !matches!(&run.stale[i], Some(s) if s.len() == n))
        {
            return Ok(true);
        }
        let survival = expected_acceptance(run, act, n);
        let pays = drafting_pays(&survival, b, n, &table, costs, &survival)?;
        if pays {
            run.refresh_after = 1;
        }
        Ok(pays)
    }

    /// Append the plain rounds' pending features of the requests `act` to their drafter
    /// contexts (before they propose); returns the seconds it took. The plain rounds caused
    /// it: it is priced as theirs (module `observed`), not as the drafted round's.
    pub(super) fn flush_pending(
        &self,
        run: &mut Run<'_, T>,
        states: &mut [D::State],
        act: &[usize],
    ) -> Result<f64> {
        let t = Instant::now();
        let mut flushed = 0;
        for &i in act {
            let (start, rows) = std::mem::take(&mut run.pending[i]);
            if rows.is_empty() {
                continue;
            }
            flushed += rows.len();
            let feats = if rows.len() == 1 {
                rows[0].clone()
            } else {
                candle_core::Tensor::cat(&rows, 0)?
            };
            self.drafter().extend(&mut states[i], &feats, start)?;
        }
        let seconds = t.elapsed().as_secs_f64();
        if flushed > 0 {
            self.observe_flush(act.len(), flushed, seconds)?;
        }
        Ok(seconds)
    }

    /// A round without drafts: one target-only step of every active request (same seeds as
    /// [`super::target_only`]), its features appended to each drafter context.
    pub(super) fn plain_round(&self, run: &mut Run<'_, T>, act: &[usize]) -> Result<()> {
        let t0 = Instant::now();
        let (out, kept, forward) = run.step(act)?;
        self.observe_forward(act.len(), forward)?;
        for (j, &i) in act.iter().enumerate() {
            // The cache took the anchor; the committed token is the next anchor. Its features
            // wait for the request's next proposal (one extension of many rows then, instead
            // of a one-row extension every round).
            let feats = out.hidden_states.get(i)?.narrow(0, 0, kept[j])?;
            let (start, rows) = &mut run.pending[i];
            if rows.is_empty() {
                *start = run.lengths[i];
            }
            rows.push(feats);
            run.lengths[i] += kept[j];
        }
        let t3 = Instant::now();
        run.since_draft += 1;
        let kernels = (t3 - t0).as_secs_f64() - forward;
        self.observe_round(act.len(), None, kernels)?;
        let st = &mut run.stats;
        st.rounds += 1;
        st.plain_rounds += 1;
        st.target_seconds += forward;
        st.kernel_seconds += kernels;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(propose: f64, rest: f64) -> Costs {
        Costs {
            propose,
            drafted_rest: rest,
            plain_rest: rest,
        }
    }

    #[test]
    fn a_compute_bound_batch_stops_drafting_and_a_cheap_draft_keeps_it() {
        // Forward time linear in tokens (compute-bound): 1 ms per token.
        let linear = StepsPerSecond::linear(vec![(1, 1000.0), (512, 1000.0 / 512.0)]).unwrap();
        let (b, n) = (16, 4);
        let conf = vec![0.7f32; b * n];
        // Drafting costs 0.5 ms per request: verifying more tokens cannot pay for it.
        assert!(
            !drafting_pays(&conf, b, n, &linear, costs(5e-4, 1e-5), &vec![0.0; b * n]).unwrap()
        );
        // A flat table (memory-bound: a forward costs the same for 1 or 64 tokens) with cheap
        // drafting: speculation pays.
        let flat = StepsPerSecond::linear(vec![(1, 1000.0), (64, 1000.0)]).unwrap();
        assert!(drafting_pays(&conf[..n], 1, n, &flat, costs(1e-4, 1e-5), &[0.0; 4]).unwrap());
        // The same confidences on a table whose cost grows slower than the tokens verified
        // (a forward of 512 tokens costs 128 of one): drafting pays again.
        let sublinear = StepsPerSecond::linear(vec![(1, 1000.0), (512, 1000.0 / 128.0)]).unwrap();
        assert!(
            drafting_pays(
                &conf,
                b,
                n,
                &sublinear,
                costs(5e-5, 1e-5),
                &vec![0.0; b * n]
            )
            .unwrap()
        );
    }

    #[test]
    fn a_plain_round_must_win_by_the_margin() {
        // 1 ms per forward whatever it verifies; one draft at 0.5: a drafted round commits
        // 1.5 tokens in 1 ms + the proposal, a plain one 1 token in 1 ms.
        let flat = StepsPerSecond::linear(vec![(1, 1000.0), (8, 1000.0)]).unwrap();
        let pays = |propose: f64| drafting_pays(&[0.5], 1, 1, &flat, costs(propose, 0.0), &[0.0]);
        // Plain faster by 5% (proposal 0.575 ms): within the margin, it drafts.
        assert!(pays(0.575e-3).unwrap());
        // Plain faster by 20% (proposal 0.8 ms): it goes plain.
        assert!(!pays(0.8e-3).unwrap());
        const { assert!(PLAIN_MARGIN > 0.05 && PLAIN_MARGIN < 0.2) };
    }

    #[test]
    fn expected_tokens_counts_survival_products() {
        let c = [0.5f32, 0.5, 1.0, 0.2];
        // Request 0 verifies 2 slots: 1 + 0.5 + 0.25; request 1 verifies 1: 1 + 1.0.
        let tau = expected_tokens(&c, 2, &[2, 1]);
        assert!((tau - 3.75).abs() < 1e-12, "{tau}");
    }
}
