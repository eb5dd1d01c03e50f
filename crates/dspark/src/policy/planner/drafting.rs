//! Whether a round drafts: the choice between a drafted and a plain round, the streak of plain
//! rounds and the refreshes that end it (the module docs of `planner` say how).

use super::{Drafting, Planner};
use crate::error::Result;
use crate::policy::StepsPerSecond;
use crate::policy::learned::MIN_SAMPLES;
use crate::policy::round_costs::Costs;
use crate::policy::weigh::{Regime, drafting_pays, stale_of};
use crate::policy::{PLAIN_MARGIN, VerifyPolicy};

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

/// The gain a drafted round must show on prior-priced costs (no drafted round of the batch
/// size timed yet) before the whole batch bets its proposals on it: the prior is a guess, so
/// twice the [`PLAIN_MARGIN`] that measured costs need.
const UNPROVEN_MARGIN: f64 = 2.0 * PLAIN_MARGIN;

/// How much faster than its one timing a plain size may really run (that timing slowed by
/// noise, or by a drafted round's weights in the caches) while the drafted round stays the
/// better choice, for that one timing to price the size ([`Planner::plain_timed`]).
const TIMING_SLACK: f64 = 1.5;

/// Request-rounds the acceptance record holds (at the first draft position) before a close
/// choice is tested with a plain round: earlier, the drafted estimate is mostly the prior's.
const EXPLORE_EVIDENCE: f64 = 8.0;

/// The streak of plain rounds: rounds since the last drafted one, after how many the next
/// one drafts anyway, whether the last round drafted by the choice (not to explore), and
/// whether it was plain only to time the plain size while the choice was for drafting.
#[derive(Debug, Clone, Copy)]
pub(super) struct Streak {
    since_draft: usize,
    refresh_after: usize,
    drafting: bool,
    timing: bool,
}

impl Default for Streak {
    fn default() -> Self {
        Self {
            since_draft: 0,
            refresh_after: 1,
            drafting: false,
            timing: false,
        }
    }
}

impl Streak {
    /// What the round before chose, for the choice's margin.
    fn regime(&self) -> Regime {
        if self.drafting {
            Regime::Drafting
        } else {
            Regime::Plain
        }
    }
}

impl Planner {
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
        self.explored = false;
        let regime = self.streak.regime();
        self.streak.drafting = false;
        self.streak.timing = false;
        let drafts = self.drafting_pays_now(stale, measured, remaining, regime)?;
        if drafts != Drafting::Plain {
            self.streak.since_draft = 0;
        } else if !self.streak.timing {
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
        regime: Regime,
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
        // The streak was priced when it began; what was timed since (a refresh's catch-up,
        // proposal and kernels; the plain rounds of the streak itself, which the first price
        // after a request's first proposal had only the prior for) can price it longer, and
        // then it runs on.
        // Priced once, where a streak ends or a request explores (what follows reads it).
        let priced = (fresh || self.streak.since_draft >= self.streak.refresh_after)
            .then(|| self.streak_price(b, &table, costs, self.costs.probe_near(b)));
        if self.streak.since_draft >= self.streak.refresh_after
            && let Some(priced) = priced
        {
            self.streak.refresh_after = self.streak.refresh_after.max(priced);
        }
        // A refresh buys its price back over the rounds after it: with fewer tokens left than
        // the streak it ends, it is not taken (the streak's growth prices how often refreshes
        // find drafting still not paying). The streak itself paid for it (its price is a share
        // of the streak's plain rounds), so a streak priced past [`REFRESH_ROUNDS`] asks only
        // that many tokens left: asking for the whole streak (up to [`REFRESH_ROUNDS_MAX`])
        // would keep every shorter request from refreshing at all, so that one early round
        // priced too high (a slow first verification, an unlucky block) kept drafting off for
        // good.
        let due = self.streak.since_draft >= self.streak.refresh_after
            && remaining >= self.streak.refresh_after.min(REFRESH_ROUNDS);
        if fresh || due {
            let best: Vec<f32> = (0..b)
                .flat_map(|_| (0..n).map(|k| self.acceptance.optimistic(k)))
                .collect();
            let could = drafting_pays(&best, b, n, &table, costs, &best, Regime::Plain)?.pays;
            if could {
                // If drafting still does not pay after it, the next streak is longer (after a
                // refresh), and long enough to pay for this round.
                let grown = if due {
                    (self.streak.refresh_after * REFRESH_GROWTH).min(REFRESH_ROUNDS)
                } else {
                    self.streak.refresh_after
                };
                let priced = priced.unwrap_or(grown);
                self.streak.refresh_after = grown.max(priced);
                // A refresh's time prices the next ones (a request's first proposal, which
                // catches its drafter context up over the whole prompt, would overprice them).
                self.explored = due;
            }
            // The round explores: one request's proposal tells what the batch's would.
            return Ok(match (could, b) {
                (false, _) => Drafting::Plain,
                (true, 1) => Drafting::All,
                (true, _) => Drafting::Probe,
            });
        }
        let survival = self.expected_acceptance(stale, n);
        let w = drafting_pays(&survival, b, n, &table, costs, &survival, regime)?;
        // A plain size with fewer than MIN_SAMPLES timings of its own is priced by the prior:
        // the plain price is a guess, so plain rounds are taken to time it (at most MIN_SAMPLES
        // per size; the ring keeps them). Where a line through the round sizes covers it
        // (`learned.rs`), once the drafted rounds' costs are timed, whatever the choice's
        // margin: without that line the price is the prior's split scaled by the drafted
        // forwards, and on a target that fits in the caches (a decode step bound by its
        // per-token work, not by reading the weights) that prices a decode step at up to three
        // times its time, so that drafting looks like it pays where it costs. Elsewhere, only
        // a close choice, once the acceptance record is not just its prior.
        let untimed = matches!(self.verify, VerifyPolicy::ScheduledMeasured)
            && !self.plain_timed(b, w.plain_share, &table);
        let unanchored = self.costs.get(b).is_some() && !self.times.line_covers(b, b..=b * (n + 1));
        let close =
            w.plain_share >= EXPLORE_SHARE && self.acceptance.evidence() >= EXPLORE_EVIDENCE;
        let explore = untimed && (unanchored || close);
        // Costs the drafter's prior priced (no drafted round of this batch size timed): the
        // whole batch drafts only on a clear gain, and once its plain size has a timing (a
        // probe's wider forward alone misprices it). A wrong bet costs the batch's proposal
        // where a probe costs one request's; a plain round costs what target-only decoding
        // does. A lone request has no cheaper bet (its probe is the whole round), so it needs
        // only the timing: with the gain asked of it, one exploring round's proposal (the
        // dearest, its catch-up over the whole prompt) kept a first call plain until its
        // streak ran out, since the costs are proven only by the drafted rounds it withheld.
        let unproven = matches!(self.verify, VerifyPolicy::ScheduledMeasured)
            && self.costs.get(b).is_none()
            && (self.times.timed(b) == 0
                || (b > 1 && w.plain_share * (1.0 + UNPROVEN_MARGIN) > 1.0));
        let pays = w.pays && !explore && !unproven;
        // A round plain only to time the plain size leaves the choice as it was: the regime
        // (and its margin) stays, and no streak of plain rounds starts. Counted as a switch,
        // a close choice for drafting would need the margin again after it, go plain, and the
        // streak then priced on the first rounds' acceptance would keep a first call plain
        // where drafting pays.
        if w.pays && explore && !unproven {
            self.streak.timing = true;
            self.streak.drafting = regime == Regime::Drafting;
        }
        if pays {
            self.streak.refresh_after = 1;
            self.streak.drafting = true;
        }
        Ok(if pays { Drafting::All } else { Drafting::Plain })
    }

    /// Whether the plain size `b` is priced by its own timings, for a choice that gives the plain
    /// round `plain_share` of the best drafted round's `Θ` on `table`: [`MIN_SAMPLES`] of them,
    /// or one where drafting would still be the better choice with the plain forward
    /// [`TIMING_SLACK`] times faster than that timing. Noise only slows a forward (as do a
    /// drafted round's weights in the caches before a plain step), so a first timing can
    /// price a plain round too high, never too low: where that could not change the choice,
    /// further plain rounds taken to time the size would only give up drafted rounds that pay
    /// (a target that reads its weights from memory, where drafting pays clearly). Where it
    /// could (a target that lives in the caches, its first plain step after a drafted round
    /// slower than the next ones), or where the plain round is cheaper at its timing than the
    /// table says (a prior that prices a cache-resident decode step at its reads), the size is
    /// timed [`MIN_SAMPLES`] times.
    pub(super) fn plain_timed(&self, b: usize, plain_share: f64, table: &StepsPerSecond) -> bool {
        let timed = self.times.timed(b);
        if timed >= MIN_SAMPLES {
            return true;
        }
        let (Some(t), priced) = (self.times.median_at(b), 1.0 / table.sps(b)) else {
            return false;
        };
        // The plain round's `Θ` at the forward's timed price, not the table's.
        let at_timing = plain_share * priced / t;
        t > 0.0 && at_timing.is_finite() && at_timing * TIMING_SLACK < 1.0
    }

    /// [`priced_streak`] for a batch of `b` with this planner's drafts and expected tokens, its
    /// exploring round `outside` seconds beyond its forward where one was timed.
    fn streak_price(
        &self,
        b: usize,
        table: &StepsPerSecond,
        costs: Costs,
        outside: Option<f64>,
    ) -> usize {
        let n = self.num_speculative;
        let explore = Explore {
            tokens: self.explore_tokens(n),
            outside,
        };
        priced_streak(b, n, table, costs, explore)
    }

    /// Tokens an exploring request is expected to commit with `n` drafts: 1 and the survival
    /// of each slot at the acceptance the record measures, a confidence of 1/2 counted as its
    /// prior (as for a request without confidences: [`PRIOR`] observations, so that one round
    /// of bad luck moves it only part of the way). The price of a refresh counts these: where
    /// drafting pays, a refresh costs nothing; where the record says it does not, what its
    /// extra time buys back. (Priced at the best acceptance the record supports instead, a
    /// refresh would look free until the record held several rounds, and a request whose
    /// drafts are rarely accepted would pay several of them in its first tokens.)
    ///
    /// [`PRIOR`]: crate::policy::acceptance::PRIOR
    pub(super) fn explore_tokens(&self, n: usize) -> f64 {
        let (mut survival, mut tokens) = (1.0, 1.0);
        for k in 0..n {
            survival *= f64::from(self.acceptance.expected(k, 0.5));
            tokens += survival;
        }
        tokens
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
