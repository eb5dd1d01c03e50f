//! What the round loop observes of its target forwards, kept by the [`Planner`](super::Planner)
//! for its lifetime: the seconds of each forward by its total token count, refining a profiled
//! (or prior) steps-per-second table. What a round spends outside the forward is
//! [`RoundCosts`](super::round_costs::RoundCosts).
//!
//! A table profiled at start is a handful of timed forwards on a short context: on a shared
//! machine it carries that moment's noise, and serving contexts grow past the profiled one.
//! The loop serves the same target every round, so each verify (and plain) forward is one more
//! timing at its count. [`ForwardTimes`] keeps the latest ones per count and rebuilds the table:
//! - a scale, the median ratio of every kept timing to the profiled cost at its count, moves
//!   the whole profile (the machine's current speed, the serving context); under the prior,
//!   two: its reads scale by the forwards they bound (decode steps) and its multiplies by
//!   the ones they bound (a prefill), so that a small model's kernels, slow against the
//!   machine's multiply rate, price a wide verification from its first prefill on;
//! - at a count with [`MIN_SAMPLES`] timings or more, their median weighs against the scaled
//!   profile as [`PROFILE_WEIGHT`] observations; fewer keep the scaled profile (one preempted
//!   forward must not price a size out of the scheduler's reach, where it would never be
//!   timed again).
//!

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;

use crate::error::Result;
use crate::policy::StepsPerSecond;
use crate::policy::prior::Split;
use crate::policy::table::median;

/// Latest timings kept per key.
const WINDOW: usize = 16;

/// Timings a token count needs before its own median prices it.
pub(crate) const MIN_SAMPLES: usize = 3;

/// Observations the scaled profile counts as at a count that has its own timings.
const PROFILE_WEIGHT: f64 = 2.0;

/// The latest [`WINDOW`] timings per key (a token count, a batch size).
#[derive(Debug, Default, Clone)]
pub(crate) struct Keyed {
    rings: BTreeMap<usize, (Vec<f64>, usize)>,
}

impl Keyed {
    /// Keep `seconds` under `key` (ignored unless `key > 0` and `seconds` finite and `>= 0`).
    pub(crate) fn record(&mut self, key: usize, seconds: f64) {
        if key == 0 || !(seconds.is_finite() && seconds >= 0.0) {
            return;
        }
        let (ring, next) = self.rings.entry(key).or_default();
        if ring.len() < WINDOW {
            ring.push(seconds);
        } else {
            ring[*next] = seconds;
        }
        *next = (*next + 1) % WINDOW;
    }

    fn get(&self, key: usize) -> &[f64] {
        self.rings.get(&key).map_or(&[], |r| &r.0)
    }

    /// The median timing of the key nearest `key` by ratio (ties: the larger key); `None`
    /// when nothing is kept.
    pub(crate) fn near(&self, key: usize) -> Option<f64> {
        self.near_counted(key).map(|(m, _)| m)
    }

    /// [`Keyed::near`] and how many timings that key holds.
    pub(crate) fn near_counted(&self, key: usize) -> Option<(f64, usize)> {
        self.nearest(key).map(|(_, m, n)| (m, n))
    }

    /// The key nearest `key` by ratio (ties: the larger), its median timing and how many
    /// timings it holds.
    pub(crate) fn nearest(&self, key: usize) -> Option<(usize, f64, usize)> {
        let target = key.max(1) as f64;
        let (k, ring) = self.rings.iter().min_by(|a, b| {
            let d = |k: usize| (k as f64 / target).ln().abs();
            d(*a.0).total_cmp(&d(*b.0)).then(b.0.cmp(a.0))
        })?;
        Some((*k, median(ring.0.clone())?, ring.0.len()))
    }
}

/// The latest forward timings per total token count (see the module docs).
#[derive(Debug, Default, Clone)]
pub(crate) struct ForwardTimes(Keyed);

impl ForwardTimes {
    /// Record one forward over `tokens` total tokens that took `seconds` (ignored unless both
    /// are positive and finite).
    pub(crate) fn record(&mut self, tokens: usize, seconds: f64) {
        if seconds > 0.0 {
            self.0.record(tokens, seconds);
        }
    }

    /// Timings kept at exactly `tokens`.
    pub(crate) fn timed(&self, tokens: usize) -> usize {
        self.0.get(tokens).len()
    }

    /// The median of the timings kept at exactly `tokens` (`None`: none).
    pub(crate) fn median_at(&self, tokens: usize) -> Option<f64> {
        median(self.0.get(tokens).to_vec())
    }

    /// `profiled` refined by the kept timings (see the module docs); the profile itself when
    /// nothing is kept. Its sizes are the profile's and every timed count. `rounds`: the
    /// counts a round can verify (a plain round's `B` to a drafted round's `B·(K + 1)`), over
    /// which a line through the timings prices the table ([`ForwardTimes::line`]).
    /// `split`: the prior's two bounds, when `profiled` is the prior (each then scales by the
    /// timings of the forwards it bounds: [`ForwardTimes::scales`]).
    pub(crate) fn refine(
        &self,
        profiled: &StepsPerSecond,
        rounds: RangeInclusive<usize>,
        split: Option<&Split>,
    ) -> Result<StepsPerSecond> {
        let Some(scales) = self.scales(profiled, split) else {
            return Ok(profiled.clone());
        };
        let line = self.line(&rounds);
        // Where the line prices, every size it covers is a point of the table (its linear
        // interpolation of steps/s between far sizes would miss the line).
        let covered = line.map_or(0..=0, |l| l.lo.ceil() as usize..=l.hi.floor() as usize);
        let sizes: BTreeSet<usize> = profiled
            .points()
            .iter()
            .map(|p| p.0)
            .chain(self.0.rings.keys().copied())
            .chain(covered.filter(|&n| n > 0).take(MAX_LINE_POINTS))
            .collect();
        let points = sizes
            .into_iter()
            .map(|n| {
                let scaled = scales.price(profiled, split, n);
                let prior = match line {
                    Some(l) if l.covers(n) => l.at(n).max(scaled / 4.0),
                    _ => scaled,
                };
                let own = self.0.get(n);
                let seconds = match median(own.to_vec()) {
                    Some(m) if own.len() >= MIN_SAMPLES => {
                        let k = own.len() as f64;
                        (PROFILE_WEIGHT * prior + k * m) / (PROFILE_WEIGHT + k)
                    }
                    _ => prior,
                };
                (n, 1.0 / seconds)
            })
            .collect();
        profiled.with_points(points)
    }

    /// How the kept timings run against `profiled` (see [`Scales`]); `None` when nothing is
    /// kept. With the prior's `split`, a timing scales the bound that prices its count: the
    /// reads where they bound it (a decode step), the multiplies where they do (a prefill, a
    /// wide verification). A bound no timing reached takes the other's scale where that is a
    /// slowdown (the per-operation costs of a small model's kernels slow both), else its own
    /// prior's (1): a bound that runs faster than priced says nothing of the other, whose rate
    /// was measured at its best. (Borrowed, a first call's prefill at 0.73 of its price priced
    /// the memory-bound pair's bf16 decode step at 28 ms, below the 38 ms its weights take to
    /// read and the 41 it took, until plain rounds timed it.)
    pub(crate) fn scales(
        &self,
        profiled: &StepsPerSecond,
        split: Option<&Split>,
    ) -> Option<Scales> {
        let (mut reads, mut multiplies) = (Vec::new(), Vec::new());
        for (&n, ring) in &self.0.rings {
            let (bound, into) = match split.map(|s| s.parts(n)) {
                Some((r, c)) if c > r => (c, &mut multiplies),
                Some((r, _)) => (r, &mut reads),
                None => (1.0 / profiled.sps(n), &mut reads),
            };
            into.extend(ring.0.iter().map(|&t| t / bound));
        }
        let ok = |v: Vec<f64>| median(v).filter(|s| s.is_finite() && *s > 0.0);
        let (read, multiply) = match (ok(reads), ok(multiplies)) {
            (Some(r), Some(m)) => (r, m),
            (Some(r), None) => (r, r.max(1.0)),
            (None, Some(m)) => (m.max(1.0), m),
            (None, None) => return None,
        };
        Some(Scales { read, multiply })
    }

    /// Whether the line through the counts timed in `rounds` ([`ForwardTimes::line`]) exists
    /// and prices `n`.
    pub(crate) fn line_covers(&self, n: usize, rounds: RangeInclusive<usize>) -> bool {
        self.line(&rounds).is_some_and(|l| l.covers(n))
    }

    /// The least-squares line `t(n) = a + b·n` through the median timing of every count timed
    /// in `rounds` (weighted by its timings), when those counts span a factor of [`LINE_SPAN`]
    /// or more with [`MIN_SAMPLES`] timings at each end: between the sizes the rounds run (a
    /// plain round's `B` tokens, a drafted round's more), it prices what the prior's shape
    /// misjudges (a small model's kernels run far below the machine's multiply rate). Other
    /// counts (a prefill) stay out of it.
    fn line(&self, rounds: &RangeInclusive<usize>) -> Option<Line> {
        let pts: Vec<(f64, f64, f64)> = self
            .0
            .rings
            .range(rounds.clone())
            .filter_map(|(&n, r)| Some((n as f64, median(r.0.clone())?, r.0.len() as f64)))
            .collect();
        let lo = pts.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
        let hi = pts.iter().map(|p| p.0).fold(0.0, f64::max);
        // Both ends need MIN_SAMPLES timings pooled (below and above the span's geometric
        // middle): a preempted forward or two must not tilt it.
        let mid = (lo * hi).sqrt();
        let pooled =
            |low: bool| -> f64 { pts.iter().filter(|p| (p.0 < mid) == low).map(|p| p.2).sum() };
        let enough = MIN_SAMPLES as f64;
        if !(hi >= LINE_SPAN * lo && pooled(true) >= enough && pooled(false) >= enough) {
            return None;
        }
        let w: f64 = pts.iter().map(|p| p.2).sum();
        let mx = pts.iter().map(|p| p.2 * p.0).sum::<f64>() / w;
        let my = pts.iter().map(|p| p.2 * p.1).sum::<f64>() / w;
        let sxx: f64 = pts.iter().map(|p| p.2 * (p.0 - mx).powi(2)).sum();
        let sxy: f64 = pts.iter().map(|p| p.2 * (p.0 - mx) * (p.1 - my)).sum();
        // A forward never costs less for more tokens: a falling fit is a flat one.
        let b = (sxy / sxx).max(0.0);
        let a = my - b * mx;
        (a.is_finite() && b.is_finite() && a > 0.0).then_some(Line {
            a,
            b,
            lo: (lo / 2.0).max(1.0),
            hi: 2.0 * hi,
        })
    }
}

/// Counts a fitted line must span (largest over smallest) before it prices.
const LINE_SPAN: f64 = 1.5;

/// Sizes the line adds to the table at most.
const MAX_LINE_POINTS: usize = 512;

/// A fitted `t(n) = a + b·n`, used for `n` in `lo..=hi` (half the smallest count fitted to twice
/// the largest).
#[derive(Debug, Clone, Copy)]
struct Line {
    a: f64,
    b: f64,
    lo: f64,
    hi: f64,
}

impl Line {
    fn covers(&self, n: usize) -> bool {
        (self.lo..=self.hi).contains(&(n as f64))
    }

    fn at(&self, n: usize) -> f64 {
        self.a + self.b * n as f64
    }
}

/// How the machine runs the target now against a table's prices: the median ratio of the
/// kept timings to the price at their counts, one for the forwards the reads bound and one
/// for those the multiplies bound (equal without the prior's split). Above 1 it runs slower
/// than priced (a busy machine, a long context, a small model's kernels below the machine's
/// rates).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Scales {
    pub(crate) read: f64,
    pub(crate) multiply: f64,
}

impl Scales {
    /// The scaled price of a forward of `n` tokens: each bound of `split` by its scale, the
    /// larger; without a split, `profiled`'s price by the one scale.
    pub(crate) fn price(&self, profiled: &StepsPerSecond, split: Option<&Split>, n: usize) -> f64 {
        match split {
            Some(s) => {
                let (r, c) = s.parts(n);
                (self.read * r).max(self.multiply * c)
            }
            None => self.read / profiled.sps(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
    }

    #[test]
    fn no_timings_leave_the_profile() {
        let p = StepsPerSecond::linear(vec![(1, 1000.0), (9, 400.0)]).unwrap();
        assert_eq!(ForwardTimes::default().refine(&p, 1..=64, None).unwrap(), p);
        let mut t = ForwardTimes::default();
        t.record(0, 1.0);
        t.record(3, f64::NAN);
        t.record(3, -1.0);
        t.record(3, 0.0);
        assert_eq!(t.refine(&p, 1..=64, None).unwrap(), p);
    }

    #[test]
    fn timings_scale_the_profile_and_price_the_counts_they_cover() {
        // Profile: 1 ms per forward up to 64 tokens (flat).
        let p = StepsPerSecond::linear(vec![(1, 1000.0), (64, 1000.0)]).unwrap();
        let mut t = ForwardTimes::default();
        // Serving: 4 tokens cost twice the profile; 5 tokens (too close to 4 for a line)
        // cost 3 ms.
        for _ in 0..WINDOW {
            t.record(4, 2e-3);
        }
        for _ in 0..WINDOW / 2 {
            t.record(5, 3e-3);
        }
        let r = t.refine(&p, 1..=64, None).unwrap();
        // The median ratio is 2: untimed counts are the profile doubled.
        assert!(close(r.sps(1), 500.0), "{}", r.sps(1));
        assert!(close(r.sps(64), 500.0), "{}", r.sps(64));
        assert!(close(r.sps(4), 500.0), "{}", r.sps(4));
        // 5 tokens: its timings (3 ms) against the scaled profile (2 ms) counted twice.
        let k = (WINDOW / 2) as f64;
        let five = (PROFILE_WEIGHT * 2e-3 + k * 3e-3) / (PROFILE_WEIGHT + k);
        assert!(close(r.sps(5), 1.0 / five), "{}", r.sps(5));
        let sizes: Vec<usize> = r.points().iter().map(|p| p.0).collect();
        assert_eq!(sizes, vec![1, 4, 5, 64]);
    }

    #[test]
    fn a_line_through_the_round_sizes_corrects_the_prior_shape() {
        // The prior says 1 ms up to 4 tokens then 0.25 ms a token (steep); the target runs
        // 1 ms + 0.05 ms a token. Rounds time 4 (plain) and 20 (drafted) tokens, and a
        // prefill of 400 once.
        let p =
            StepsPerSecond::linear(vec![(1, 1000.0), (4, 1000.0), (64, 1000.0 / 16.0)]).unwrap();
        let truth = |n: usize| 1e-3 + 5e-5 * n as f64;
        let mut t = ForwardTimes::default();
        for _ in 0..8 {
            t.record(4, truth(4));
        }
        t.record(20, truth(20));
        t.record(21, truth(21));
        t.record(24, truth(24));
        t.record(400, 0.2);
        let r = t.refine(&p, 1..=64, None).unwrap();
        // Between and around the round sizes the line prices the target, not the prior.
        for n in [4, 12, 20, 30] {
            let got = 1.0 / r.sps(n);
            assert!(
                (got - truth(n)).abs() < 1e-3 * truth(n),
                "{n}: {got} vs {}",
                truth(n)
            );
        }
        // Two drafted timings are not enough to tilt it: the scaled prior.
        let mut few = ForwardTimes::default();
        for _ in 0..8 {
            few.record(4, 4e-3);
        }
        few.record(20, 5.0);
        few.record(21, 5.0);
        let r = few.refine(&p, 1..=64, None).unwrap();
        assert!(close(r.sps(12), p.sps(12) / 4.0), "{}", r.sps(12));
        // One count alone (no span): the old rule, the scaled prior.
        let mut one = ForwardTimes::default();
        for _ in 0..4 {
            one.record(4, 2e-3);
        }
        let r = one.refine(&p, 1..=64, None).unwrap();
        assert!(close(r.sps(20), p.sps(20) / 2.0), "{}", r.sps(20));
    }

    #[test]
    fn reads_and_multiplies_scale_apart_under_the_prior_s_split() {
        use crate::models::ForwardCost;
        use crate::nn::WeightDtype;
        use crate::policy::Machine;
        use crate::policy::prior::prior_table;
        // 10 ms of reads, 1 ms a token of multiplies: the knee at 10 tokens.
        let cost = ForwardCost {
            weight_bytes: 1e8,
            flops_per_token: 1e8,
            layers: 1,
            dtype: WeightDtype::F32,
            quant: None,
            layer_seconds: Some(1e-12),
        };
        let m = Machine {
            read_bytes_per_s: 1e10,
            cache_bytes: 0.0,
            cache_read_bytes_per_s: 1e10,
            flops_f32: 1e11,
            flops_bf16: 1e11,
            flops_q8_0: 1e11,
            flops_q4_k: 1e11,
        };
        let split = Split::new(&cost, &m, false);
        let prior = prior_table(&cost, &m, false, 64, 8).unwrap();
        // Decode steps run at twice the reads' price, a prefill of 400 tokens at half the
        // multiplies'.
        let mut t = ForwardTimes::default();
        for _ in 0..5 {
            t.record(1, 2e-2);
        }
        t.record(400, 0.2);
        let r = t.refine(&prior, 1..=1, Some(&split)).unwrap();
        let secs = |n: usize| 1.0 / r.sps(n);
        // 9 tokens: the reads (20 ms) bound it; 64: the multiplies (32 ms, not 64 x 2).
        assert!((secs(9) - 2e-2).abs() < 1e-6, "{}", secs(9));
        assert!((secs(64) - 3.2e-2).abs() < 1e-6, "{}", secs(64));
        // One scale without the split: the median ratio (2, the decode steps') prices all.
        let one = t.refine(&prior, 1..=1, None).unwrap();
        assert!(
            (1.0 / one.sps(64) - 0.128).abs() < 1e-6,
            "{}",
            1.0 / one.sps(64)
        );
        // Before any forward bound by the multiplies is timed, the reads' scale prices both.
        let mut decode = ForwardTimes::default();
        decode.record(1, 2e-2);
        let s = decode.scales(&prior, Some(&split)).unwrap();
        assert_eq!(s.read, s.multiply);
        // A prefill faster than its price says nothing of the reads: they keep the prior's.
        let mut prefill = ForwardTimes::default();
        prefill.record(400, 0.2);
        let s = prefill.scales(&prior, Some(&split)).unwrap();
        assert!((s.multiply - 0.5).abs() < 1e-9 && s.read == 1.0, "{s:?}");
        assert!(
            (1.0 / prefill.refine(&prior, 1..=1, Some(&split)).unwrap().sps(1) - 1e-2).abs() < 1e-6
        );
        // A slow one (a small model's kernels) slows both.
        prefill.record(400, 1.6);
        prefill.record(400, 1.6);
        let s = prefill.scales(&prior, Some(&split)).unwrap();
        assert!(s.read == s.multiply && s.read > 1.0, "{s:?}");
    }

    #[test]
    fn slow_forwards_do_not_price_a_count_until_they_are_the_norm() {
        let p = StepsPerSecond::linear(vec![(1, 1000.0), (16, 100.0)]).unwrap();
        let mut t = ForwardTimes::default();
        for _ in 0..5 {
            t.record(1, 1e-3);
        }
        // Preempted forwards at 9 tokens, 50x the profile: too few to price 9.
        for _ in 0..MIN_SAMPLES - 1 {
            t.record(9, 50.0 / p.sps(9));
        }
        let r = t.refine(&p, 1..=64, None).unwrap();
        assert!(close(r.sps(9), p.sps(9)), "{} vs {}", r.sps(9), p.sps(9));
        // With normal timings after them the median is normal, and the ring keeps the latest
        // WINDOW: normal timings push the slow ones out.
        for _ in 0..WINDOW {
            t.record(9, 1.0 / p.sps(9));
        }
        let r = t.refine(&p, 1..=64, None).unwrap();
        assert!(close(r.sps(9), p.sps(9)), "{} vs {}", r.sps(9), p.sps(9));
    }
}
