//! A round's plan for its running requests: whether it drafts at all, the proposals (one
//! drafter call per draft temperature), and how many drafts each request verifies.
//!
//! The paper's scheduler chooses how many drafts each request verifies, for a round whose
//! drafting is already paid. Over a batch on a compute-bound target the best choice can be no
//! draft at all, and then the proposal itself was the waste. Before proposing, a scheduling
//! policy weighs the two rounds it can run with the same objective `Θ = E[tokens] · SPS'`:
//! - drafted: the scheduler's lengths over each request's expected acceptance (the engine's
//!   measured per-position acceptance, its latest confidences weighing in as a prior), the
//!   table priced with the measured cost of proposing and of the rest of a drafted round;
//! - plain: one token per request, the table priced with the rest of a plain round.
//!
//! It drafts unless the best drafted round verifies nothing or the plain round is faster by
//! more than [`PLAIN_MARGIN`]: a plain round teaches nothing (no confidences, no acceptance),
//! the switch has costs the model does not price (appending the pending rows, a refresh
//! round), and near a tie the estimates' noise would decide. Confidences go stale in plain
//! rounds: after a streak of them (1 plain round after drafting stopped paying, then 2, 4…
//! up to [`REFRESH_ROUNDS`], back to 1 whenever drafting pays again), and for a request
//! without confidences yet, the round drafts to refresh them if drafting would pay at the
//! best acceptance the record supports; where even that does not pay (a compute-bound batch),
//! no refresh is taken and the rounds stay plain. A plain round is exactly a target-only step
//! (same seeds: greedy output is unchanged and sampling stays exact); its features (and a
//! joining request's prefill features) wait for the request's next proposal, and extend its
//! drafter context in one call then.
//!
//! A request whose own limit (`max_drafts`, its budget) leaves no draft, or that never drafts,
//! takes the same target-only step inside a drafted round.

use std::time::Instant;

use super::acceptance::unit;
use super::commit::append_pending;
use super::engine::Engine;
use super::learned::Costs;
use super::output::StepOutput;
use super::round::Plan;
use crate::drafter::Drafter;
use crate::error::Result;
use crate::schedule::{
    StepsPerSecond, VerifyPolicy, schedule_lengths_batch, schedule_pipelined, threshold_lengths,
};
use crate::target::{MAX_PROFILE_TOKENS, TargetModel, measure_steps_per_second};

/// Most plain rounds in a row before a round drafts again, to refresh the confidences the
/// choice is made from.
pub const REFRESH_ROUNDS: usize = 16;

/// How much faster (relative) a plain round must be expected to run than the best drafted
/// round before a round skips drafting.
pub const PLAIN_MARGIN: f64 = 0.1;

/// The streak of plain rounds: rounds since the last drafted one, and after how many the next
/// one drafts anyway.
#[derive(Debug, Clone, Copy)]
pub(super) struct Streak {
    since_draft: usize,
    refresh_after: usize,
}

impl Default for Streak {
    fn default() -> Self {
        Self {
            since_draft: 0,
            refresh_after: 1,
        }
    }
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
    let lens = schedule_lengths_batch(stale, b, n, &drafted, ahead)?;
    let verified = b + lens.iter().sum::<usize>();
    let theta_drafted = expected_tokens(stale, n, &lens) * drafted.sps(verified);
    let theta_plain = bf * sps.with_overhead(bf * costs.plain_rest).sps(b);
    // A drafted round that would verify nothing is a plain round that also proposed.
    Ok(verified > b && theta_plain <= (1.0 + PLAIN_MARGIN) * theta_drafted)
}

impl<T: TargetModel, D: Drafter> Engine<T, D> {
    /// The plan of this round for the running rows `act`.
    pub(super) fn plan_round(&mut self, act: Vec<usize>, out: &mut StepOutput) -> Result<Plan> {
        let n = self.num_speculative;
        // Each request's own limit: its max_drafts and its budget (a round commits at most
        // drafts + 1 tokens).
        let caps: Vec<usize> = act
            .iter()
            .map(|&i| match &self.rows[i] {
                Some(s) if s.state.is_some() => self
                    .drafts_for(&s.spec)
                    .min(s.budget_left().saturating_sub(1)),
                _ => 0,
            })
            .collect();
        let drafting: Vec<usize> = (0..act.len()).filter(|&j| caps[j] > 0).collect();
        // The measured table, once per round (profiled at first use, outside the round's
        // timings, which price the scheduler's table).
        let measured = match (&self.config.verify, drafting.is_empty()) {
            (VerifyPolicy::ScheduledMeasured, false) => {
                Some(self.measured_table(drafting.len() * (n + 1), n + 1)?)
            }
            _ => None,
        };
        let rows: Vec<usize> = drafting.iter().map(|&j| act[j]).collect();
        let plain = !drafting.is_empty() && !self.drafts_this_round(&rows, measured.as_ref())?;
        let mut plan = Plan {
            lens: vec![0; act.len()],
            drafts: vec![Vec::new(); act.len()],
            q: None,
            confidence: vec![None; act.len()],
            drafted: vec![false; act.len()],
            plain,
            propose_seconds: 0.0,
            act,
        };
        if plain || drafting.is_empty() {
            if plain {
                self.streak.since_draft += 1;
            }
            return Ok(plan);
        }
        self.streak.since_draft = 0;
        let t = Instant::now();
        let flushed = self.flush_pending(&plan, &drafting)?;
        let k = self.propose(&mut plan, &drafting)?;
        let seconds = t.elapsed().as_secs_f64();
        plan.propose_seconds = seconds - flushed;
        out.timing.drafter_seconds += seconds;
        // A request that failed proposing ends alone (it verifies nothing).
        let drafting: Vec<usize> = drafting.into_iter().filter(|&j| plan.drafted[j]).collect();
        if drafting.is_empty() {
            return Ok(plan);
        }
        let lens = self.verify_lengths(&plan, &drafting, k, measured.as_ref())?;
        for (&j, len) in drafting.iter().zip(lens) {
            plan.lens[j] = len.min(caps[j]);
        }
        self.acceptance.decay();
        Ok(plan)
    }

    /// Append the pending features of the requests `drafting` (indices into `plan.act`) to
    /// their drafter contexts, before they propose. Returns the seconds it took.
    fn flush_pending(&mut self, plan: &Plan, drafting: &[usize]) -> Result<f64> {
        let t = Instant::now();
        for &j in drafting {
            let Some(slot) = self.rows[plan.act[j]].as_mut() else {
                continue;
            };
            let pending = std::mem::take(&mut slot.pending);
            if let Some(state) = slot.state.as_mut() {
                append_pending(&self.drafter, state, pending)?;
            }
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// Whether this round of the drafting rows `rows` drafts (see the module docs).
    /// `measured`: this round's measured table (under `ScheduledMeasured`).
    fn drafts_this_round(
        &mut self,
        rows: &[usize],
        measured: Option<&StepsPerSecond>,
    ) -> Result<bool> {
        let n = self.num_speculative;
        let b = rows.len();
        let table = match &self.config.verify {
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
        let Some(costs) = self.observed.costs.get(b) else {
            return Ok(true);
        };
        // A refresh (the streak is due) or a request without confidences yet: the round's
        // choice would be made on confidences it does not have. Fresh ones can only change it
        // if drafting pays at the best acceptance the record supports
        // (`Acceptance::optimistic`); where even that does not pay, a drafted round is waste (on
        // a compute-bound batch it also appends every pending feature row).
        let fresh = rows.iter().any(|&i| {
            !self.rows[i]
                .as_ref()
                .is_some_and(|s| matches!(&s.stale, Some(c) if c.len() == n))
        });
        let due = self.streak.since_draft >= self.streak.refresh_after;
        if fresh || due {
            let best: Vec<f32> = (0..b)
                .flat_map(|_| (0..n).map(|k| self.acceptance.optimistic(k)))
                .collect();
            let could = drafting_pays(&best, b, n, &table, costs, &best)?;
            if could && due {
                // If drafting still does not pay after it, the next streak is longer.
                self.streak.refresh_after = (self.streak.refresh_after * 2).min(REFRESH_ROUNDS);
            }
            return Ok(could);
        }
        let survival = self.expected_acceptance(rows, n);
        let pays = drafting_pays(&survival, b, n, &table, costs, &survival)?;
        if pays {
            self.streak.refresh_after = 1;
        }
        Ok(pays)
    }

    /// Per row and draft position `k < n` (`[B·n]`), the acceptance expected before this
    /// round's draws: the measured rate at `k`, with the request's previous-round confidence
    /// counted as a prior (1/2 without one). The survival the drafting decision weighs, and
    /// the scheduler's look-ahead (never this round's confidences: lossless).
    fn expected_acceptance(&self, rows: &[usize], n: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(rows.len() * n);
        for &i in rows {
            match self.rows[i].as_ref().and_then(|s| s.stale.as_ref()) {
                Some(s) if s.len() == n => {
                    out.extend(
                        s.iter()
                            .enumerate()
                            .map(|(k, &c)| self.acceptance.expected(k, unit(c))),
                    );
                }
                _ => out.extend((0..n).map(|k| self.acceptance.expected(k, 0.5))),
            }
        }
        out
    }

    /// Drafts to verify per drafting request (`drafting`, indices into `plan.act`): the
    /// policy's choice over blocks of `k` (capped later by each request's own limit).
    fn verify_lengths(
        &mut self,
        plan: &Plan,
        drafting: &[usize],
        k: usize,
        measured: Option<&StepsPerSecond>,
    ) -> Result<Vec<usize>> {
        let n = self.num_speculative.min(k);
        let b = drafting.len();
        let confidence: Option<Vec<f32>> = drafting
            .iter()
            .map(|&j| plan.confidence[j].as_ref().map(|c| c[..n].to_vec()))
            .collect::<Option<Vec<_>>>()
            .map(|rows| rows.concat());
        let (policy, raw) = match (&self.config.verify, confidence) {
            (VerifyPolicy::Full, _) | (_, None) => return Ok(vec![n; b]),
            (policy, Some(c)) => (policy.clone(), c),
        };
        let rows: Vec<usize> = drafting.iter().map(|&j| plan.act[j]).collect();
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
            .observed
            .costs
            .get(b)
            .map(|c| b as f64 * (c.propose + c.drafted_rest));
        let priced = |sps: &StepsPerSecond| match outside {
            Some(secs) => sps.with_overhead(secs),
            None => sps.clone(),
        };
        // The scheduler looks past a cliff in the table over the whole batch: the other
        // requests' slots, and each request's own continuation on the acceptance expected
        // from earlier rounds (never from its own draws of this round: lossless).
        let ahead = self.expected_acceptance(&rows, n);
        let lens = match &policy {
            VerifyPolicy::Threshold(t) => threshold_lengths(&firsts, b, n, *t)?,
            VerifyPolicy::Scheduled(sps) => {
                schedule_lengths_batch(&firsts, b, n, &priced(sps), &ahead)?
            }
            VerifyPolicy::ScheduledMeasured => {
                let sps = match measured {
                    Some(t) => t.clone(),
                    None => self.measured_table(b * (n + 1), n + 1)?,
                };
                schedule_lengths_batch(&firsts, b, n, &priced(&sps), &ahead)?
            }
            VerifyPolicy::Pipelined(sps) => {
                // A request's previous-round confidences (its own current ones in its first
                // round) size the batch; current survival fills it.
                let stale: Vec<f32> = rows
                    .iter()
                    .enumerate()
                    .flat_map(
                        |(r, &i)| match self.rows[i].as_ref().and_then(|s| s.stale.clone()) {
                            Some(s) if s.len() == n => s,
                            _ => firsts[r * n..(r + 1) * n].to_vec(),
                        },
                    )
                    .collect();
                schedule_pipelined(&stale, &firsts, b, n, &priced(sps))?
            }
            VerifyPolicy::Full => vec![n; b],
        };
        for (r, &i) in rows.iter().enumerate() {
            if let Some(s) = self.rows[i].as_mut() {
                s.stale = Some(firsts[r * n..(r + 1) * n].to_vec());
            }
        }
        Ok(lens)
    }

    /// The steps-per-second table measured on the target, at least up to `tokens` verified
    /// tokens (profiled on first use, again when a larger batch needs more), refined by the
    /// forwards observed since (module `learned`).
    pub(super) fn measured_table(
        &mut self,
        tokens: usize,
        row_tokens: usize,
    ) -> Result<StepsPerSecond> {
        // Past MAX_PROFILE_TOKENS the table holds tokens/s constant: a huge batch's first
        // round must not wait on a profile of its whole size.
        let tokens = tokens.min(MAX_PROFILE_TOKENS.max(row_tokens));
        let profile = match &self.observed.profile {
            Some((max, table)) if *max >= tokens => table.clone(),
            _ => {
                // A batch that outgrows the profile doubles it: under continuous batching the
                // batch grows a request at a time, and profiling at every size it passes
                // through would cost more than the rounds it prices.
                let before = self.observed.profile.as_ref().map_or(0, |s| s.0);
                let want = tokens
                    .max(before.saturating_mul(2))
                    .min(MAX_PROFILE_TOKENS.max(row_tokens));
                let table = measure_steps_per_second(&self.target, want, row_tokens)?;
                self.observed.profile = Some((want, table.clone()));
                table
            }
        };
        self.observed.times.refine(&profile)
    }

    /// Time one forward over `tokens` total tokens into the measured table (only under
    /// [`VerifyPolicy::ScheduledMeasured`]).
    pub(super) fn observe_forward(&mut self, tokens: usize, seconds: f64) {
        if matches!(self.config.verify, VerifyPolicy::ScheduledMeasured) {
            self.observed.times.record(tokens, seconds);
        }
    }

    /// Keep what a round spent outside its forward and proposal under a scheduling policy:
    /// `kernels` seconds outside the drafter, `extension` appending to drafter contexts. A
    /// drafted round's per-request proposal, kernels and extension, or a plain round's
    /// kernels (its extension, at the pending cap, keeps the option to draft: not a cost of
    /// the plain regime).
    pub(super) fn observe_round(&mut self, plan: &Plan, kernels: f64, extension: f64) {
        if !self.schedules() {
            return;
        }
        let b = plan.act.len();
        let costs = &mut self.observed.costs;
        if plan.plain {
            costs.record_plain(b, kernels);
        } else if plan.drafted.iter().any(|&d| d) {
            costs.record_drafted(b, plan.propose_seconds, kernels, extension);
        }
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
