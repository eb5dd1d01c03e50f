//! Verify-length scheduling: the paper's Appendix A counterexample (early stop is lossless, a
//! global search on current confidences is not, a look-ahead on predicted acceptance is), the
//! pipelined variant, and basic properties.

use crate::sampling_common::{appendix_a, assert_differs, assert_follows};
use dspark::policy::{
    StepsPerSecond, schedule_lengths, schedule_lengths_ahead, schedule_pipelined, threshold_lengths,
};

/// Appendix A: two tokens, target p = (0.7, 0.3), draft q = (0.5, 0.5), c_1 = 0.8, and
/// c_2 = 0.9 after drafting token 0 but 0 after token 1. SPS(1) = 1, SPS(2) = 0.5, SPS(3) = 0.45.
///
/// Early stop: Θ(ℓ=0) = 1 > Θ(ℓ=1) = 1.8·0.5 = 0.9, so it never drafts → output ~ p.
/// Global search: Θ(ℓ=2) = (1 + 0.8 + 0.72)·0.45 = 1.134 > 1 after token 0 (verify 2; token 0
/// is always accepted since p(0) > q(0)), but Θ(ℓ=2) = 0.81 after token 1 (verify none) →
/// P(first = 0) = 0.5·1 + 0.5·0.7 = 0.85.
fn appendix_a(policy: impl Fn(&[f32], usize) -> usize, seed: u64) -> Vec<u64> {
    appendix_a::appendix_a(1, |c, i| vec![policy(c, i)], seed).swap_remove(0)
}

fn sps() -> StepsPerSecond {
    StepsPerSecond::step(vec![(1, 1.0), (2, 0.5), (3, 0.45)]).unwrap()
}

#[test]
fn appendix_a_early_stop_is_lossless() {
    let counts = appendix_a(|c, _| schedule_lengths(c, 1, 2, &sps()).unwrap()[0], 1);
    assert_follows(&counts, &[0.7, 0.3], "early stop");
}

#[test]
fn appendix_a_global_search_on_current_confidences_is_biased() {
    // The pipelined scheduler fed the CURRENT confidences as "stale" is exactly the global
    // search without early stop.
    let counts = appendix_a(|c, _| schedule_pipelined(c, c, 1, 2, &sps()).unwrap()[0], 2);
    assert_follows(&counts, &[0.85, 0.15], "global search");
    assert_differs(&counts, &[0.7, 0.3], "global search");
}

#[test]
fn appendix_a_pipelined_with_truly_stale_confidences_is_lossless() {
    // Capacity from an earlier, independent round's confidences: it cannot anticipate the
    // current draws, so the output follows p.
    let counts = appendix_a(
        |c, i| {
            let stale = [0.8, if i % 2 == 0 { 0.9 } else { 0.0 }];
            schedule_pipelined(&stale, c, 1, 2, &sps()).unwrap()[0]
        },
        3,
    );
    assert_follows(&counts, &[0.7, 0.3], "pipelined");
}

#[test]
fn appendix_a_look_ahead_on_predicted_acceptance_is_lossless() {
    // Predicted acceptance 0.9 at slot 2 (from earlier rounds, not this draw): slot 1 is
    // admitted on the promise of slot 2 (Θ 1.134 > 1 across the cliff at 2 tokens), then slot
    // 2 is verified exactly when its own survival pays (c_2 = 0.9 after token 0). The choice
    // for slot 1 never reads c_2, so the output follows p while the scan crosses the cliff.
    let lengths = |c: &[f32]| schedule_lengths_ahead(c, 1, 2, &sps(), &[0.8, 0.9]).unwrap()[0];
    assert_eq!(lengths(&[0.8, 0.9]), 2);
    assert_eq!(lengths(&[0.8, 0.0]), 1);
    let counts = appendix_a(|c, _| lengths(c), 4);
    assert_follows(&counts, &[0.7, 0.3], "look-ahead");
}

#[test]
fn look_ahead_crosses_a_cliff_the_early_stop_cannot() {
    // A CPU-like table: 1-6 tokens cost little more than one, 7+ cost a row tile more.
    let ms = [0.65, 0.73, 0.88, 1.09, 1.29, 1.27, 1.99, 2.21, 2.36];
    let table = StepsPerSecond::linear(
        ms.iter()
            .enumerate()
            .map(|(i, m)| (i + 1, 1e3 / m))
            .collect(),
    )
    .unwrap()
    .with_overhead(2e-3);
    let high = [0.97f32; 8];
    assert_eq!(schedule_lengths(&high, 1, 8, &table).unwrap(), vec![5]);
    assert_eq!(
        schedule_lengths_ahead(&high, 1, 8, &table, &[0.97; 8]).unwrap(),
        vec![8]
    );
    // Predicted acceptance too low to repay the cliff: it stops where the early stop does.
    assert_eq!(
        schedule_lengths_ahead(&high, 1, 8, &table, &[0.3; 8]).unwrap(),
        vec![5]
    );
    // Past the cliff the current survival still rules: a low slot ends the request there.
    let dip = [0.97f32, 0.97, 0.97, 0.97, 0.97, 0.97, 0.05, 0.97];
    assert_eq!(
        schedule_lengths_ahead(&dip, 1, 8, &table, &[0.97; 8]).unwrap(),
        vec![6]
    );
}

#[test]
fn look_ahead_of_zero_is_the_paper_scheduler() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state >> 40
    };
    // Non-monotone, as a noisy profile is: 2 tokens read slower than 3 or 4.
    let table = StepsPerSecond::linear(vec![
        (1, 100.0),
        (2, 60.0),
        (4, 120.0),
        (8, 80.0),
        (32, 20.0),
    ])
    .unwrap();
    for _ in 0..500 {
        let (b, k) = (1 + next() as usize % 4, 1 + next() as usize % 6);
        let c: Vec<f32> = (0..b * k)
            .map(|_| next() as f32 / (1u64 << 24) as f32)
            .collect();
        assert_eq!(
            schedule_lengths_ahead(&c, b, k, &table, &vec![0.0; b * k]).unwrap(),
            schedule_lengths(&c, b, k, &table).unwrap(),
            "{c:?}"
        );
    }
    let err = schedule_lengths_ahead(&[0.5; 4], 2, 2, &table, &[0.5; 3]).unwrap_err();
    assert_eq!(err.code(), "bad-shape");
}

#[test]
fn the_paper_scheduler_admits_by_survival_and_stops_early() {
    // Constant SPS: every slot with positive survival strictly improves Θ.
    let flat = StepsPerSecond::step(vec![(1, 1.0), (2, 0.5)]).unwrap();
    let c = [0.9, 0.9, 0.0, 0.5, 0.5, 0.5];
    // Past the table SPS falls as 1/tokens, so Θ = τ/B: admit while survival beats the mean.
    let lengths = schedule_lengths(&c, 2, 3, &flat).unwrap();
    let survival = [0.9, 0.81, 0.5, 0.25];
    let mut tau = 2.0;
    let mut b = 2.0;
    let mut admitted = 0;
    for a in survival {
        if (tau + a) / (b + 1.0) > tau / b {
            tau += a;
            b += 1.0;
            admitted += 1;
        } else {
            break;
        }
    }
    assert_eq!(lengths.iter().sum::<usize>(), admitted);
    let cheap = StepsPerSecond::step(vec![(1, 1.0), (100, 1.0)]).unwrap();
    assert_eq!(schedule_lengths(&c, 2, 3, &cheap).unwrap(), vec![2, 3]);
    // Prefix property: survival never increases along a request, so lengths are prefixes.
    let costly = StepsPerSecond::step(vec![(2, 1.0), (3, 0.1), (100, 0.1)]).unwrap();
    assert_eq!(schedule_lengths(&c, 2, 3, &costly).unwrap(), vec![0, 0]);
    // A jagged table: the early stop halts at the cliff, the global search crosses it.
    let jagged = StepsPerSecond::step(vec![(2, 1.0), (3, 0.6), (6, 0.6)]).unwrap();
    let c = [0.95, 0.95, 0.95, 0.95];
    assert_eq!(schedule_lengths(&c, 2, 2, &jagged).unwrap(), vec![0, 0]);
    assert_eq!(
        schedule_pipelined(&c, &c, 2, 2, &jagged).unwrap(),
        vec![2, 2]
    );
}

#[test]
fn pipelined_allocates_capacity_by_current_survival() {
    let cheap = StepsPerSecond::step(vec![(1, 1.0), (5, 1.0), (6, 0.1), (100, 0.1)]).unwrap();
    // Stale: capacity 3 (B = 2 + 3 = 5 tokens is the last cheap size).
    let stale = [0.9, 0.9, 0.9, 0.9, 0.9, 0.9];
    let current = [0.2, 0.2, 0.2, 0.99, 0.99, 0.99];
    assert_eq!(
        schedule_pipelined(&stale, &current, 2, 3, &cheap).unwrap(),
        vec![0, 3]
    );
}

#[test]
fn threshold_truncates_before_the_first_low_confidence() {
    let c = [0.9, 0.6, 0.4, 0.9, 0.1, 0.9];
    assert_eq!(threshold_lengths(&c, 2, 3, 0.5).unwrap(), vec![2, 1]);
    assert_eq!(threshold_lengths(&c, 2, 3, 0.0).unwrap(), vec![3, 3]);
}
