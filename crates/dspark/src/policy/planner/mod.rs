//! The planner: the policy state a serving engine keeps (acceptance per draft position, the
//! measured steps-per-second table, round costs, the streak of plain rounds) and the two
//! choices it makes each round from it: whether the round drafts at all, and how many drafts
//! each request verifies. It sees requests only as their confidences: the engine's round
//! (`engine/round`) gathers them and applies what it decides.
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
//! more than [`PLAIN_MARGIN`](super::PLAIN_MARGIN): a plain round teaches nothing (no
//! confidences, no acceptance), the switch has costs the model does not price (appending the
//! pending rows, a refresh round), and near a tie the estimates' noise would decide.
//! Confidences go stale in plain rounds: after a streak of them (1 plain round after drafting
//! stopped paying, then 4, 16… up to [`REFRESH_ROUNDS`], back to 1 whenever drafting pays
//! again; and at least as many as make the exploring round's time beyond the plain rounds'
//! that would commit as many tokens, priced from the round costs or a timed probe's,
//! [`REFRESH_SHARE`] of the streak's, up to [`REFRESH_ROUNDS_MAX`]: so a change of conditions
//! is noticed within that many rounds), and before any drafted round (no request has
//! confidences, the record is empty), the round explores if drafting would pay at the best
//! acceptance the record supports; where even that does not pay (a compute-bound batch), no
//! refresh is taken and the rounds stay plain; nor is one taken when fewer tokens are left to
//! generate than the streak it would end. An exploring round of several requests is a probe
//! ([`Drafting::Probe`]): one request drafts (the first without confidences, else each in
//! turn), paying one proposal and one context catch-up where the whole batch would pay `B` of
//! each, and the next round weighs the batch on what it taught (a request without
//! confidences by the record). A plain round
//! is exactly a target-only step (same seeds: greedy output is unchanged and sampling stays
//! exact); its features (and a joining request's prefill features) wait for the request's
//! next proposal, and extend its drafter context in one call then.
//!
//! Under the learned table ([`VerifyPolicy::ScheduledMeasured`]) the round costs need no
//! drafted round either: until a batch size has its proposals timed, proposing is priced from
//! the drafter's shape ([`Drafter::propose_cost`](crate::drafter::Drafter::propose_cost)) on
//! this machine, scaled as the target's timings run against its own prior, and once any
//! proposal is timed (a probe's), by how far that one ran from its own price. A batch whose best
//! drafted round loses even with every draft accepted then never drafts (on a small target,
//! a batch of 16), where it used to pay two drafted rounds to learn so. On such prior-priced
//! costs the whole batch drafts only once its plain size has a timing and on a clear gain (by
//! [`PLAIN_MARGIN`](super::PLAIN_MARGIN)): a wrong bet costs the batch's proposal, a plain
//! round what target-only decoding does.
//!
//! Under the learned table, a choice for drafting that is close (the plain round expected at
//! [`EXPLORE_SHARE`] of the drafted one or more) while the plain round's size has fewer than
//! `MIN_SAMPLES` timings rests on the prior's guess of that size: once the acceptance record
//! holds 8 request-rounds, a plain round is taken to time it, up to `MIN_SAMPLES` per size.
//!
//! A request whose own limit (`max_drafts`, its budget) leaves no draft, or that never drafts,
//! takes the same target-only step inside a drafted round.

use super::acceptance::{Acceptance, unit};
use super::learned::{Costs, ForwardTimes, MIN_SAMPLES, RoundCosts};
use super::machine::Machine;
use super::prior::{Split, prior_table};
use super::profile::{MAX_PROFILE_TOKENS, measure_steps_per_second};
use super::weigh::{drafting_pays, stale_of};
use super::{
    PLAIN_MARGIN, StepsPerSecond, VerifyPolicy, schedule_lengths_batch, schedule_pipelined,
    threshold_lengths,
};
use crate::error::Result;
use crate::models::{ForwardCost, TargetModel};
use crate::nn::WeightDtype;

/// Most plain rounds in a row before a round drafts again, to refresh the confidences the
/// choice is made from.
pub const REFRESH_ROUNDS: usize = 16;

/// By how much the streak of plain rounds before the next refresh grows after a refresh that
/// found drafting still not paying (a refresh is a drafted round: on a target too cheap to draft
/// for, each costs several plain ones).
const REFRESH_GROWTH: usize = 4;

/// The most a refresh may cost, as a share of the plain rounds of the streak it ends: a
/// streak after an exploring round is at least long enough that the exploring round's time
/// beyond the plain rounds that would commit as many tokens stays within this share.
const REFRESH_SHARE: f64 = 0.05;

/// The longest streak of plain rounds [`REFRESH_SHARE`] makes: drafting is tried again at
/// least this often, so a change (a machine that got quieter) is noticed within it.
pub const REFRESH_ROUNDS_MAX: usize = 64;

/// A plain round whose expected `Θ` is at least this share of the best drafted round's is close
/// enough to be tried when its size has not been timed (the choice rests on the prior there).
pub const EXPLORE_SHARE: f64 = 0.8;

/// The most a timed proposal rescales the drafter's prior, either way (one timing can be an
/// outlier: a first call's one-time costs, a preempted thread).
const PROPOSAL_RATIO_MAX: f64 = 8.0;

/// Request-rounds the acceptance record holds (at the first draft position) before a close
/// choice is tested with a plain round: earlier, the drafted estimate is mostly the prior's.
const EXPLORE_EVIDENCE: f64 = 8.0;

/// What a round does with its drafting requests ([`Planner::drafts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drafting {
    /// No request drafts: a target-only step.
    Plain,
    /// Every drafting request drafts.
    All,
    /// One request drafts, to learn what the choice needs (confidences, the acceptance, a
    /// proposal's time) at the price of one request's proposal and context catch-up; the others
    /// take target-only steps in the same forward.
    Probe,
}

/// The streak of plain rounds: rounds since the last drafted one, and after how many the next
/// one drafts anyway.
#[derive(Debug, Clone, Copy)]
struct Streak {
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

/// The table [`VerifyPolicy::ScheduledMeasured`] refines: the prior from the target's shape
/// and the machine ([`prior_table`]), built up to the verified tokens the rounds need, or the
/// one [`Planner::warm_up`] timed on the target (read past its end as tokens/s held
/// constant).
#[derive(Debug)]
struct Base {
    /// Tokens the table reaches.
    max: usize,
    table: StepsPerSecond,
    /// Timed on the target rather than priced from its shape.
    profiled: bool,
    /// The prior's two bounds (`None` for a profile).
    split: Option<Split>,
}

/// The prior table of `target` up to `tokens` verified tokens in rows of `row_tokens` (see
/// `prior.rs`), and its split: its stated [`ForwardCost`], else the estimate from its shape
/// (f32 weights on a CPU, 2-byte ones on a device).
fn prior_of<T: TargetModel>(
    target: &T,
    tokens: usize,
    row_tokens: usize,
) -> Result<(StepsPerSecond, Split)> {
    let accelerator = !target.device().is_cpu();
    let cost = match target.forward_cost()? {
        Some(c) => c,
        None => ForwardCost::estimate(
            target.num_hidden_layers(),
            target.hidden_size(),
            target.vocab_size(),
            if accelerator {
                WeightDtype::BF16
            } else {
                WeightDtype::F32
            },
        ),
    };
    let machine = machine_for(accelerator);
    Ok((
        prior_table(&cost, &machine, accelerator, tokens, row_tokens)?,
        Split::new(&cost, &machine, accelerator),
    ))
}

/// This machine, or the nominal `accelerator`.
fn machine_for(accelerator: bool) -> Machine {
    if accelerator {
        Machine::accelerator()
    } else {
        Machine::current()
    }
}

/// The policy state of one engine and the choices made from it (see the module docs).
#[derive(Debug)]
pub(crate) struct Planner {
    verify: VerifyPolicy,
    /// Drafts verified per round at most (the engine's limit).
    num_speculative: usize,
    /// Whether the drafter gives confidences (without, a round verifies whole blocks and the
    /// drafting choice reads the measured acceptance alone).
    confidences: bool,
    acceptance: Acceptance,
    /// The table the forward timings refine: the prior, or a profile when one was asked for.
    base: Option<Base>,
    /// Forward timings that refine the base table.
    times: ForwardTimes,
    /// A round's costs outside the forward.
    costs: RoundCosts,
    /// The drafter's block pass by shape: the price of proposing until proposals are timed.
    drafter: Option<DrafterPrior>,
    streak: Streak,
    /// Probe rounds taken (whose turn the next one is).
    probes: usize,
}

/// The drafter's block pass by shape ([`Drafter::propose_cost`](crate::drafter::Drafter)):
/// a proposal for `B` requests passes `B · rows` rows, on an accelerator or not.
#[derive(Debug, Clone, Copy)]
struct DrafterPrior {
    cost: ForwardCost,
    rows: usize,
    accelerator: bool,
}

impl Planner {
    /// A planner for `verify` over blocks of at most `num_speculative` drafts from a drafter
    /// that gives `confidences` or not.
    pub(crate) fn new(verify: VerifyPolicy, num_speculative: usize, confidences: bool) -> Self {
        Self {
            verify,
            num_speculative,
            confidences,
            acceptance: Acceptance::default(),
            base: None,
            times: ForwardTimes::default(),
            costs: RoundCosts::default(),
            drafter: None,
            streak: Streak::default(),
            probes: 0,
        }
    }

    /// The drafter's block pass by shape (`cost`, per row; `rows` per request), for the
    /// policy to price proposing before it has timed a proposal: priced on this machine (or
    /// the nominal `accelerator`) and scaled as the target's own timings run against its
    /// prior. Without it (`None`: a drafter that does not state one) the first rounds of each
    /// batch size draft to time their proposals.
    pub(crate) fn with_drafter_cost(
        mut self,
        cost: Option<ForwardCost>,
        rows: usize,
        accelerator: bool,
    ) -> Self {
        self.drafter = cost
            .filter(|c| c.validate().is_ok())
            .map(|cost| DrafterPrior {
                cost,
                rows: rows.max(1),
                accelerator,
            });
        self
    }

    /// The costs of a round of `b` requests outside the target forward: as timed
    /// ([`RoundCosts::get`]), else with proposing priced by the drafter's shape under the
    /// learned table (see [`Planner::with_drafter_cost`]).
    fn round_costs(&self, b: usize) -> Option<Costs> {
        let prior = self.proposal_prior(b).map(|seconds| {
            // A timed proposal (a probe's, or a drafted round's of another size) says how far
            // the shape's price runs from this drafter's real one (a small drafter's per-op
            // costs run far above its FLOPs): the prior of `b` takes the same ratio.
            let ratio = self
                .costs
                .proposal_near(b)
                .and_then(|(k, timed)| Some(timed / self.proposal_prior(k)?))
                .filter(|r| r.is_finite() && *r > 0.0)
                .map_or(1.0, |r| {
                    r.clamp(1.0 / PROPOSAL_RATIO_MAX, PROPOSAL_RATIO_MAX)
                });
            seconds * ratio / b.max(1) as f64
        });
        self.costs.get_or_prior(b, prior)
    }

    /// Seconds the drafter's shape prices a proposal of `b` requests at, under the learned
    /// table (scaled as the target's timings run against the target's own prior); `None`
    /// without a drafter cost or another policy.
    fn proposal_prior(&self, b: usize) -> Option<f64> {
        match (&self.verify, &self.drafter, &self.base) {
            (VerifyPolicy::ScheduledMeasured, Some(d), Some(base)) => {
                let split = Split::new(&d.cost, &machine_for(d.accelerator), d.accelerator);
                let rows = b.max(1) * d.rows;
                Some(match self.times.scales(&base.table, base.split.as_ref()) {
                    Some(scales) => scales.price(&base.table, Some(&split), rows),
                    None => {
                        let (read, multiply) = split.parts(rows);
                        read.max(multiply)
                    }
                })
            }
            _ => None,
        }
    }

    /// Whether the policy uses the confidence policies' bookkeeping (round costs, pending
    /// features kept for a later proposal).
    pub(crate) fn schedules(&self) -> bool {
        matches!(
            self.verify,
            VerifyPolicy::Scheduled(_)
                | VerifyPolicy::ScheduledMeasured
                | VerifyPolicy::Pipelined(_)
        )
    }

    /// This round's table for `drafting` drafting requests, under
    /// [`VerifyPolicy::ScheduledMeasured`] (the prior, or the profile [`Planner::warm_up`]
    /// timed, refined by the forwards timed so far); `None` otherwise.
    pub(crate) fn round_table<T: TargetModel>(
        &mut self,
        target: &T,
        drafting: usize,
    ) -> Result<Option<StepsPerSecond>> {
        let n = self.num_speculative;
        match (&self.verify, drafting) {
            (VerifyPolicy::ScheduledMeasured, 1..) => self
                .measured_table(target, drafting * (n + 1), n + 1)
                .map(Some),
            _ => Ok(None),
        }
    }

    /// What a round of the drafting requests whose previous-round confidences are `stale`
    /// (one entry each) does; the streak of plain rounds follows. `measured`: this round's
    /// table (see [`Planner::round_table`]); `remaining`: the most tokens a drafting request
    /// may still commit (its budget).
    pub(crate) fn drafts(
        &mut self,
        stale: &[Option<&[f32]>],
        measured: Option<&StepsPerSecond>,
        remaining: usize,
    ) -> Result<Drafting> {
        let drafts = self.drafting_pays_now(stale, measured, remaining)?;
        if drafts != Drafting::Plain {
            self.streak.since_draft = 0;
        } else {
            self.streak.since_draft += 1;
        }
        Ok(drafts)
    }

    /// The number of the next probe round (whose request drafts in turn).
    pub(crate) fn next_probe(&mut self) -> usize {
        self.probes += 1;
        self.probes - 1
    }

    /// A round drafts whatever the policy would choose (a request in it needs it): the
    /// streak of plain rounds ends.
    pub(crate) fn drafting_forced(&mut self) {
        self.streak.since_draft = 0;
    }

    fn drafting_pays_now(
        &mut self,
        stale: &[Option<&[f32]>],
        measured: Option<&StepsPerSecond>,
        remaining: usize,
    ) -> Result<Drafting> {
        let n = self.num_speculative;
        let b = stale.len();
        let table = match &self.verify {
            VerifyPolicy::Scheduled(s) | VerifyPolicy::Pipelined(s) => s.clone(),
            VerifyPolicy::ScheduledMeasured => match measured {
                Some(t) => t.clone(),
                None => return Ok(Drafting::All),
            },
            VerifyPolicy::Full | VerifyPolicy::Threshold(_) => return Ok(Drafting::All),
        };
        if n == 0 {
            return Ok(Drafting::All);
        }
        let Some(costs) = self.round_costs(b) else {
            return Ok(Drafting::All);
        };
        // A refresh (the streak is due) or a request without confidences yet: the round's
        // choice would be made on confidences it does not have. Fresh ones can only change it
        // if drafting pays at the best acceptance the record supports
        // (`Acceptance::optimistic`); where even that does not pay, a drafted round is waste (on
        // a compute-bound batch it also appends every pending feature row). A drafter without
        // a confidence head never has any: its choice reads the measured acceptance alone.
        // Once the record holds a drafted round, a request without confidences is weighed by
        // it (the normal choice below), not explored for.
        let fresh = self.confidences
            && self.acceptance.evidence() <= 0.0
            && (0..b).any(|r| stale_of(stale, r, n).is_none());
        // A refresh buys its price back over the rounds after it: with fewer tokens left than
        // the streak it ends, it is not taken (the streak's growth prices how often refreshes
        // find drafting still not paying).
        let due = self.streak.since_draft >= self.streak.refresh_after
            && remaining >= self.streak.refresh_after;
        if fresh || due {
            let best: Vec<f32> = (0..b)
                .flat_map(|_| (0..n).map(|k| self.acceptance.optimistic(k)))
                .collect();
            let could = drafting_pays(&best, b, n, &table, costs, &best)?.pays;
            if could {
                // If drafting still does not pay after it, the next streak is longer (after a
                // refresh), and long enough to pay for this round.
                let grown = if due {
                    (self.streak.refresh_after * REFRESH_GROWTH).min(REFRESH_ROUNDS)
                } else {
                    self.streak.refresh_after
                };
                let explore = Explore {
                    tokens: self.explore_tokens(n),
                    outside: self.costs.probe_near(b),
                };
                self.streak.refresh_after = grown.max(priced_streak(b, n, &table, costs, explore));
            }
            // The round explores: one request's proposal tells what the batch's would.
            return Ok(match (could, b) {
                (false, _) => Drafting::Plain,
                (true, 1) => Drafting::All,
                (true, _) => Drafting::Probe,
            });
        }
        let survival = self.expected_acceptance(stale, n);
        let w = drafting_pays(&survival, b, n, &table, costs, &survival)?;
        // A close choice on a learned table whose plain size was never timed: the plain price
        // is the prior's guess, so a plain round is taken to time it (at most MIN_SAMPLES per
        // size; the ring keeps them), once the acceptance record is not just its prior.
        let explore = matches!(self.verify, VerifyPolicy::ScheduledMeasured)
            && w.plain_share >= EXPLORE_SHARE
            && self.acceptance.evidence() >= EXPLORE_EVIDENCE
            && self.times.timed(b) < MIN_SAMPLES;
        // Costs the drafter's prior priced (no drafted round of this batch size timed): the
        // whole batch drafts only on a clear gain, and once its plain size has a timing (a
        // probe's wider forward alone misprices it). A wrong bet costs the batch's proposal;
        // a plain round costs what target-only decoding does.
        let unproven = matches!(self.verify, VerifyPolicy::ScheduledMeasured)
            && self.costs.get(b).is_none()
            && (self.times.timed(b) == 0 || w.plain_share * (1.0 + PLAIN_MARGIN) > 1.0);
        let pays = w.pays && !explore && !unproven;
        if pays {
            self.streak.refresh_after = 1;
        }
        Ok(if pays { Drafting::All } else { Drafting::Plain })
    }

    /// Tokens an exploring request would commit with `n` drafts at the best acceptance the
    /// record supports (the acceptance that makes exploring worth it,
    /// [`Acceptance::optimistic`]): 1 and the survival of each slot.
    fn explore_tokens(&self, n: usize) -> f64 {
        let mut survival = 1.0;
        let mut tokens = 1.0;
        for k in 0..n {
            survival *= f64::from(self.acceptance.optimistic(k));
            tokens += survival;
        }
        tokens
    }

    /// Per request and draft position `k < n` (`[B·n]`), the acceptance expected before this
    /// round's draws: the measured rate at `k`, with the request's previous-round confidence
    /// counted as a prior (1/2 without one). The survival the drafting decision weighs, and
    /// the scheduler's look-ahead (never this round's confidences: lossless).
    fn expected_acceptance(&self, stale: &[Option<&[f32]>], n: usize) -> Vec<f32> {
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

    /// The table of [`VerifyPolicy::ScheduledMeasured`] for up to `tokens` verified tokens in
    /// rows of `row_tokens`: the base table (the prior, rebuilt larger when a batch outgrows
    /// it; a profile from [`Planner::warm_up`] as timed) refined by the forwards observed
    /// since (module `learned`). Nothing is timed here: the prior costs microseconds.
    pub(crate) fn measured_table<T: TargetModel>(
        &mut self,
        target: &T,
        tokens: usize,
        row_tokens: usize,
    ) -> Result<StepsPerSecond> {
        // Past MAX_PROFILE_TOKENS the table holds tokens/s constant.
        let tokens = tokens.min(MAX_PROFILE_TOKENS.max(row_tokens));
        let base = match self.base.take() {
            Some(b) if b.profiled || b.max >= tokens => b,
            _ => {
                let (table, split) = prior_of(target, tokens, row_tokens)?;
                Base {
                    max: tokens,
                    table,
                    profiled: false,
                    split: Some(split),
                }
            }
        };
        let table = self.times.refine(
            &base.table,
            (tokens / row_tokens).max(1)..=tokens,
            base.split.as_ref(),
        );
        self.base = Some(base);
        table
    }

    /// Time the target's table for up to `batch` requests, under
    /// [`VerifyPolicy::ScheduledMeasured`] (nothing under other policies): a profile of its
    /// forwards ([`measure_steps_per_second`]) replaces the prior. Only when asked: the prior
    /// and the rounds' own timings need no profile.
    pub(crate) fn warm_up<T: TargetModel>(&mut self, target: &T, batch: usize) -> Result<()> {
        if !matches!(self.verify, VerifyPolicy::ScheduledMeasured) || batch == 0 {
            return Ok(());
        }
        let row = self.num_speculative + 1;
        let tokens = batch.saturating_mul(row).min(MAX_PROFILE_TOKENS.max(row));
        self.base = Some(Base {
            max: tokens,
            table: measure_steps_per_second(target, tokens, row)?,
            profiled: true,
            split: None,
        });
        Ok(())
    }

    /// The table in use, once built: the base table refined by the forwards observed so far.
    pub(crate) fn measured_steps_per_second(&self) -> Option<StepsPerSecond> {
        let base = self.base.as_ref()?;
        self.times
            .refine(&base.table, 1..=base.max, base.split.as_ref())
            .ok()
    }

    /// Time one forward over `tokens` total tokens into the measured table (only under
    /// [`VerifyPolicy::ScheduledMeasured`]).
    pub(crate) fn observe_forward(&mut self, tokens: usize, seconds: f64) {
        if matches!(self.verify, VerifyPolicy::ScheduledMeasured) {
            self.times.record(tokens, seconds);
        }
    }

    /// Keep what a round of `batch` requests spent outside its forward and proposal under a
    /// scheduling policy: `kernels` seconds outside the drafter, `extension` appending to
    /// drafter contexts. A drafted round (`drafted`: a request proposed) keeps its
    /// per-request proposal (`propose` seconds), kernels and extension; a `plain` round its
    /// kernels (its extension, at the pending cap, keeps the option to draft: not a cost of
    /// the plain regime).
    pub(crate) fn observe_round(
        &mut self,
        batch: usize,
        plain: bool,
        drafted: bool,
        propose: f64,
        kernels: f64,
        extension: f64,
    ) {
        if !self.schedules() {
            return;
        }
        if plain {
            self.costs.record_plain(batch, kernels);
        } else if drafted {
            self.costs
                .record_drafted(batch, propose, kernels, extension);
        }
    }

    /// A probe round of `batch` requests spent `seconds` outside its forward (its catch-up,
    /// proposal and kernels), under a scheduling policy: what an exploring round costs.
    pub(crate) fn observe_probe(&mut self, batch: usize, seconds: f64) {
        if self.schedules() {
            self.costs.record_probe(batch, seconds);
        }
    }

    /// `requests` requests proposed in one call (a drafted round's or a probe's) in `seconds`
    /// (under a scheduling policy).
    pub(crate) fn observe_proposal(&mut self, requests: usize, seconds: f64) {
        if self.schedules() {
            self.costs.record_proposal(requests, seconds);
        }
    }

    /// Keep a request's round: `verified` drafts, `accepted` of them, with the confidences
    /// the head gave them.
    pub(crate) fn observe_acceptance(
        &mut self,
        verified: usize,
        accepted: usize,
        confidence: Option<&[f32]>,
    ) {
        self.acceptance.record(verified, accepted, confidence);
    }

    /// Age the acceptance record by one drafted round.
    pub(crate) fn decay(&mut self) {
        self.acceptance.decay();
    }
}

/// What an exploring round (one request drafting: a probe, or the round itself at `b = 1`)
/// is expected to give and was timed to cost.
#[derive(Debug, Clone, Copy)]
struct Explore {
    /// Tokens its drafting request commits ([`Planner::explore_tokens`]).
    tokens: f64,
    /// A timed probe's seconds outside its forward, when one was (a catch-up after a long
    /// streak costs more than a drafted round's extension).
    outside: Option<f64>,
}

/// Plain rounds of `b` requests that an exploring round drafting `n` costs [`REFRESH_SHARE`]
/// of, on `table` with `costs`: the shortest streak it pays for, at most
/// [`REFRESH_ROUNDS_MAX`]. Its cost is its time beyond the plain rounds' that commit as many
/// tokens (`b − 1 + tokens`): a lone request's refresh, which drafts for the whole batch,
/// costs about nothing (it is taken because drafting could pay), a probe of a batch the
/// proposal and the catch-up the other requests do not share.
fn priced_streak(
    b: usize,
    n: usize,
    table: &StepsPerSecond,
    costs: Costs,
    explore: Explore,
) -> usize {
    let plain = 1.0 / table.with_overhead(b as f64 * costs.plain_rest).sps(b);
    let commits = (b.saturating_sub(1) as f64 + explore.tokens) / b.max(1) as f64;
    let explore = match explore.outside.filter(|s| s.is_finite() && *s >= 0.0) {
        Some(outside) => 1.0 / table.sps(b + n) + outside,
        None => {
            let others = b.saturating_sub(1) as f64 * costs.plain_rest;
            let rest = costs.propose + costs.drafted_rest + others;
            1.0 / table.with_overhead(rest).sps(b + n)
        }
    };
    let extra = (explore - plain * commits).max(0.0);
    let rounds = (extra / (REFRESH_SHARE * plain)).ceil();
    if rounds.is_finite() {
        (rounds as usize).clamp(1, REFRESH_ROUNDS_MAX)
    } else {
        REFRESH_ROUNDS_MAX
    }
}

#[cfg(test)]
mod tests;
