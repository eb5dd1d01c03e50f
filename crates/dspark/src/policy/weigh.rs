//! Weighing a drafted round against a plain one: the expected tokens of a drafted round, the
//! upper bound over every drafted round that lets most rounds skip the scheduler's search, and
//! the choice itself with its [`PLAIN_MARGIN`]. The planner calls it before
//! each round with the requests' latest confidences.

use super::acceptance::unit;
use super::round_costs::Costs;
use super::{StepsPerSecond, schedule_lengths_batch};
use crate::error::Result;

/// How much faster (relative) one kind of round must be expected to run than the other before
/// the planner switches to it: a drafting streak goes plain once a plain round is expected
/// faster by more than this, and a plain streak drafts only once the best drafted round is.
/// Near a tie the rounds stay what they were (the estimates' noise would decide, and a switch
/// has costs the model does not price: appending the pending rows), and a choice that starts
/// drafting must expect a gain: where drafting and plain decoding tie, plain decoding is
/// never slower.
pub const PLAIN_MARGIN: f64 = 0.05;

/// What the round before chose (the hysteresis of [`PLAIN_MARGIN`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Regime {
    /// It drafted by the choice (not to explore): drafting goes on unless a plain round is
    /// expected faster by more than the margin.
    Drafting,
    /// It was plain or explored: a round drafts only if it is expected faster by more than
    /// the margin.
    Plain,
}

impl Regime {
    /// The largest `Θ_plain / Θ_drafted` at which a round drafts.
    pub(crate) fn plain_share_max(self) -> f64 {
        match self {
            Self::Drafting => 1.0 + PLAIN_MARGIN,
            Self::Plain => 1.0 / (1.0 + PLAIN_MARGIN),
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

/// An upper bound of `Θ` over every drafted round of `b` requests (survivals `c`, `[B·n]`) on
/// the table `sps`: over each size `m` of `b + 1 ..= b·(n + 1)` verified tokens, the expected
/// tokens of the `m - b` slots of highest survival product times `SPS(m)`. (Products fall
/// along a request's slots, so the best `m - b` are a prefix of each request: a round the
/// scheduler could pick.)
fn drafted_bound(c: &[f32], b: usize, n: usize, sps: &StepsPerSecond) -> f64 {
    let mut products: Vec<f64> = Vec::with_capacity(b * n);
    for r in 0..b {
        let mut a = 1.0;
        for &x in &c[r * n..(r + 1) * n] {
            a *= unit(x);
            products.push(a);
        }
    }
    products.sort_by(|x, y| y.total_cmp(x));
    let mut tau = b as f64;
    let mut best = 0.0f64;
    for (i, a) in products.iter().enumerate() {
        tau += a;
        best = best.max(tau * sps.sps(b + i + 1));
    }
    best
}

/// How a drafted round of `b` requests whose latest confidences are `stale` (`[B·n]`) weighs
/// against a plain round, given the table `sps`, the per-request costs outside the forward, the
/// scheduler's look-ahead `ahead` (`[B·n]`) and what the round before chose (`regime`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Weighed {
    /// Drafting beats the plain round by the regime's margin ([`Regime::plain_share_max`]).
    pub(super) pays: bool,
    /// `Θ` of the plain round over `Θ` of the best drafted round (0 when the search was
    /// skipped: the plain round wins by more than the margin).
    pub(super) plain_share: f64,
}

pub(super) fn drafting_pays(
    stale: &[f32],
    b: usize,
    n: usize,
    sps: &StepsPerSecond,
    costs: Costs,
    ahead: &[f32],
    regime: Regime,
) -> Result<Weighed> {
    let share_max = regime.plain_share_max();
    let bf = b as f64;
    let drafted = sps.with_overhead(bf * (costs.propose + costs.drafted_rest));
    let theta_plain = bf * sps.with_overhead(bf * costs.plain_rest).sps(b);
    // No drafted round of `m` verified tokens beats the `m - b` most likely slots at the table's
    // price of `m`: when even the best such bound loses by the margin, the search
    // (O((B·K)²)) is skipped. On a target too cheap to draft for, that is every round.
    if theta_plain > share_max * drafted_bound(stale, b, n, &drafted) {
        return Ok(Weighed {
            pays: false,
            plain_share: 0.0,
        });
    }
    let lens = schedule_lengths_batch(stale, b, n, &drafted, ahead)?;
    let verified = b + lens.iter().sum::<usize>();
    let theta_drafted = expected_tokens(stale, n, &lens) * drafted.sps(verified);
    // A drafted round that would verify nothing is a plain round that also proposed.
    Ok(Weighed {
        pays: verified > b && theta_plain <= share_max * theta_drafted,
        plain_share: theta_plain / theta_drafted,
    })
}

/// A request's previous-round confidences when they cover `n` positions.
pub(super) fn stale_of<'a>(stale: &[Option<&'a [f32]>], r: usize, n: usize) -> Option<&'a [f32]> {
    stale.get(r).copied().flatten().filter(|s| s.len() == n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: Regime = Regime::Plain;

    fn costs(propose: f64, rest: f64) -> Costs {
        Costs {
            propose,
            drafted_rest: rest,
            plain_rest: rest,
        }
    }

    #[test]
    fn a_compute_bound_batch_stops_drafting_and_a_cheap_draft_keeps_it() {
        // Whether `b` requests with confidences `conf` draft on `table` at `propose` seconds a
        // request (after a plain round).
        let pays = |conf: &[f32], b: usize, table: &StepsPerSecond, propose: f64| {
            let n = conf.len() / b;
            drafting_pays(
                conf,
                b,
                n,
                table,
                costs(propose, 1e-5),
                &vec![0.0; b * n],
                PLAIN,
            )
            .unwrap()
            .pays
        };
        // Forward time linear in tokens (compute-bound): 1 ms per token.
        let linear = StepsPerSecond::linear(vec![(1, 1000.0), (512, 1000.0 / 512.0)]).unwrap();
        let (b, n) = (16, 4);
        let conf = vec![0.7f32; b * n];
        // Drafting costs 0.5 ms per request: verifying more tokens cannot pay for it.
        assert!(!pays(&conf, b, &linear, 5e-4));
        // A flat table (memory-bound: a forward costs the same for 1 or 64 tokens) with cheap
        // drafting: speculation pays.
        let flat = StepsPerSecond::linear(vec![(1, 1000.0), (64, 1000.0)]).unwrap();
        assert!(pays(&conf[..n], 1, &flat, 1e-4));
        // The same confidences on a table whose cost grows slower than the tokens verified
        // (a forward of 512 tokens costs 128 of one): drafting pays again.
        let sublinear = StepsPerSecond::linear(vec![(1, 1000.0), (512, 1000.0 / 128.0)]).unwrap();
        assert!(pays(&conf, b, &sublinear, 5e-5));
    }

    #[test]
    fn a_switch_needs_the_margin_either_way() {
        // 1 ms per forward whatever it verifies; one draft at 0.5: a drafted round commits
        // 1.5 tokens in 1 ms + the proposal, a plain one 1 token in 1 ms.
        let flat = StepsPerSecond::linear(vec![(1, 1000.0), (8, 1000.0)]).unwrap();
        let pays = |propose: f64, regime| {
            drafting_pays(&[0.5], 1, 1, &flat, costs(propose, 0.0), &[0.0], regime)
                .map(|w| w.pays)
                .unwrap()
        };
        // Drafting faster by 7% (proposal 0.4 ms): it drafts either way.
        assert!(pays(0.4e-3, Regime::Drafting) && pays(0.4e-3, PLAIN));
        // Plain faster by 3% (proposal 0.55 ms): a drafting streak goes on, a plain one stays.
        assert!(pays(0.55e-3, Regime::Drafting));
        assert!(!pays(0.55e-3, PLAIN));
        // Drafting faster by 2% (proposal 0.47 ms): within the margin, a plain streak stays.
        assert!(!pays(0.47e-3, PLAIN));
        // Plain faster by 7% (proposal 0.6 ms): it goes plain either way.
        assert!(!pays(0.6e-3, Regime::Drafting) && !pays(0.6e-3, PLAIN));
        const { assert!(PLAIN_MARGIN > 0.03 && PLAIN_MARGIN < 0.1) };
    }

    #[test]
    fn the_bound_is_above_every_drafted_round_and_decides_like_the_search() {
        let table = StepsPerSecond::linear(vec![(1, 1000.0), (8, 900.0), (64, 200.0)]).unwrap();
        let (b, n) = (3, 4);
        let c = [
            0.9f32, 0.8, 0.5, 0.1, 0.6, 0.6, 0.6, 0.6, 0.2, 0.9, 0.9, 0.9,
        ];
        let bound = drafted_bound(&c, b, n, &table);
        // Every prefix-closed choice of lengths is below the bound.
        for l0 in 0..=n {
            for l1 in 0..=n {
                for l2 in 0..=n {
                    let lens = [l0, l1, l2];
                    let m = b + lens.iter().sum::<usize>();
                    if m > b {
                        let theta = expected_tokens(&c, n, &lens) * table.sps(m);
                        assert!(theta <= bound + 1e-9, "{lens:?}: {theta} > {bound}");
                    }
                }
            }
        }
        // The skip changes no decision: with and without it, on tables from flat to steep.
        for slope in [0.0, 0.5, 2.0, 8.0, 64.0] {
            let t =
                StepsPerSecond::linear(vec![(1, 1000.0), (64, 1000.0 / (1.0 + slope))]).unwrap();
            for propose in [0.0, 1e-4, 1e-3, 1e-2] {
                let k = costs(propose, 1e-5);
                for regime in [Regime::Drafting, PLAIN] {
                    let fast = drafting_pays(&c, b, n, &t, k, &c, regime).unwrap().pays;
                    let drafted = t.with_overhead(b as f64 * (k.propose + k.drafted_rest));
                    let lens = schedule_lengths_batch(&c, b, n, &drafted, &c).unwrap();
                    let verified = b + lens.iter().sum::<usize>();
                    let theta_plain = b as f64 * t.with_overhead(b as f64 * k.plain_rest).sps(b);
                    let theta = expected_tokens(&c, n, &lens) * drafted.sps(verified);
                    let slow = verified > b && theta_plain <= regime.plain_share_max() * theta;
                    assert_eq!(fast, slow, "slope {slope} propose {propose} {regime:?}");
                }
            }
        }
    }

    #[test]
    fn expected_tokens_counts_survival_products() {
        let c = [0.5f32, 0.5, 1.0, 0.2];
        // Request 0 verifies 2 slots: 1 + 0.5 + 0.25; request 1 verifies 1: 1 + 1.0.
        let tau = expected_tokens(&c, 2, &[2, 1]);
        assert!((tau - 3.75).abs() < 1e-12, "{tau}");
    }
}
