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
//! Each switch needs a margin, [`PLAIN_MARGIN`](super::PLAIN_MARGIN): a round after a plain one (or
//! after an exploring one) drafts only if the best drafted round is expected faster by more than
//! it, and a round after one that drafted by this choice goes plain only if the plain round is.
//! Near a tie the rounds stay what they were (the estimates' noise would decide, and a switch has
//! costs the model does not price: appending the pending rows), and drafting never starts on a tie,
//! where plain decoding is never slower. A drafted round that would verify nothing is a plain
//! round. Confidences go stale in plain rounds: after a streak of them (1 plain round after
//! drafting stopped paying, then 4, 16… up to [`REFRESH_ROUNDS`], back to 1 whenever drafting pays
//! again; and at least as many as make the exploring round's time beyond the plain rounds' that
//! would commit the tokens it is expected to (at the acceptance the record measures), priced from
//! the round costs or a timed exploring round's (a probe's, or a lone request's refresh, its
//! catch-up included), [`REFRESH_SHARE`] of the streak's, up to [`REFRESH_ROUNDS_MAX`], and priced
//! again when it falls due, on what was timed since (a refresh's time, the streak's own plain
//! rounds where the first price had the prior): so a change of conditions is noticed within that
//! many rounds), and before any drafted round (no request has confidences, the record is empty),
//! the round explores if drafting would gain by the margin at the best acceptance the record
//! supports; where even that does not pay (a compute-bound batch), no refresh is taken and the
//! rounds stay plain; nor is one taken when fewer tokens are left to generate than the streak it
//! would end, or than [`REFRESH_ROUNDS`] where that streak is longer.
//!
//! An exploring round of several requests is a probe ([`Drafting::Probe`]): one request
//! drafts (the first without confidences, else each in turn), paying one proposal and one context
//! catch-up where the whole batch would pay `B` of each, and the next round weighs the batch on
//! what it taught (a request without confidences by the record). A plain round is exactly a
//! target-only step (same seeds: greedy output is unchanged and sampling stays exact); its features
//! (and a joining request's prefill features) wait for the request's next proposal, and extend its
//! drafter context in one call then.
//!
//! Under the learned table ([`VerifyPolicy::ScheduledMeasured`]) the round costs need no
//! drafted round either: until a batch size has its proposals timed, proposing is priced from
//! the drafter's shape ([`Drafter::propose_cost`](crate::drafter::Drafter::propose_cost)) on
//! this machine, scaled as the target's timings run against its own prior, and once any
//! proposal is timed (a probe's), by how far that one ran from its own price. A batch whose best
//! drafted round loses even with every draft accepted then never drafts (on a small target,
//! a batch of 16) and pays no drafted round to learn so. On such prior-priced
//! costs the whole batch drafts only once its plain size has a timing and on a clear gain (by
//! twice [`PLAIN_MARGIN`](super::PLAIN_MARGIN)): a wrong bet costs the batch's proposal, a plain
//! round what target-only decoding does. A lone request needs only the timing (its probe is
//! its whole round: there is no cheaper bet).
//!
//! Under the learned table, a choice for drafting while the plain round's size has fewer than
//! `MIN_SAMPLES` timings rests on the prior's guess of that size, and a plain round is taken to
//! time it, up to `MIN_SAMPLES` per size: as soon as the drafted rounds' costs are timed where
//! no line through the round sizes prices it (the prior scaled by the drafted forwards alone
//! can price a cache-resident target's decode step at three times its time, and drafting then
//! looks like it pays where it costs), else once the choice is close (the plain round expected
//! at [`EXPLORE_SHARE`] of the drafted one or more) and the acceptance record holds 8
//! request-rounds. Such a round leaves the choice as it was: it is neither a switch (the
//! margin the next round needs is the one before it) nor part of a streak of plain rounds. One
//! timing prices the size alone where drafting would still win with the plain round 1.5 times
//! faster than timed: noise only slows a forward, and further plain rounds would give up drafted
//! rounds that pay.
//!
//! A request whose own limit (`max_drafts`, its budget) leaves no draft, or that never drafts,
//! takes the same target-only step inside a drafted round.

mod drafting;
mod lengths;
mod table;

use drafting::Streak;
pub use drafting::{EXPLORE_SHARE, REFRESH_ROUNDS, REFRESH_ROUNDS_MAX};
use table::{Base, machine_for};

use super::VerifyPolicy;
use super::acceptance::Acceptance;
use super::learned::ForwardTimes;
use super::prior::Split;
use super::round_costs::{Costs, RoundCosts};
use crate::models::ForwardCost;

/// The most a timed proposal rescales the drafter's prior, either way (one timing can be an
/// outlier: a first call's one-time costs, a preempted thread).
const PROPOSAL_RATIO_MAX: f64 = 8.0;

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
    /// The latest choice was a refresh: one request drafted to learn, a probe's or, alone, the
    /// whole batch's round.
    explored: bool,
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
            explored: false,
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

    /// Whether the latest round's choice ([`Planner::drafts`]) was a refresh: its time outside
    /// the forward (catch-up, proposal, kernels) prices the next ones
    /// ([`Planner::observe_probe`]), a lone request's as a probe's.
    pub(crate) fn explored(&self) -> bool {
        self.explored
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

#[cfg(test)]
mod tests;
