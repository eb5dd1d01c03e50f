//! In-block penalties (`ProposeOptions::in_block`): a token drafted at slot `k` is penalized at
//! the later slots of the same block, the reported draft logits say so, and tokens the request
//! generated before the block get no second presence penalty.
use crate::drafter_common::{Tiny, context, load};
use crate::sampling_common::{assert_follows, softmax};
use dspark::sampling::Seeds;
use dspark::{DraftState, Drafter, InBlockPenalty, ProposeOptions};

const V: usize = 48;

fn state(d: &dspark::Qwen3Drafter) -> DraftState {
    let mut s = d.new_state().unwrap();
    d.extend(&mut s, &context(3, 1, 6).get(0).unwrap(), 0)
        .unwrap();
    s
}

fn pen(presence: f32, frequency: f32, seen: Vec<u32>) -> Option<Vec<InBlockPenalty>> {
    Some(vec![InBlockPenalty {
        presence,
        frequency,
        seen,
    }])
}

#[test]
fn later_slots_report_the_penalty_of_earlier_drafts() {
    let (_dir, d) = load(&Tiny::default());
    let s = state(&d);
    let plain = ProposeOptions {
        temperature: 1.0,
        seeds: Seeds::PerRequest(vec![11]),
        ..ProposeOptions::default()
    };
    let a = d.propose_cached(&[&s], &[2], &plain).unwrap();
    let opts = ProposeOptions {
        in_block: pen(0.5, 0.75, vec![]),
        guides: None,
        ..plain.clone()
    };
    let b = d.propose_cached(&[&s], &[2], &opts).unwrap();
    // Slot 0 is drawn as without the option (same stream, nothing drafted before it).
    assert_eq!(a.tokens[0], b.tokens[0]);
    assert_eq!(a.draft_logits[..V], b.draft_logits[..V]);
    // Slot 1 follows the same Markov input; its logits differ by presence + frequency at the
    // token slot 0 drafted, and nowhere else (compared against another finite entry).
    let t = b.tokens[0] as usize;
    let u = (t + 1) % V;
    let (ra, rb) = (&a.draft_logits[V..2 * V], &b.draft_logits[V..2 * V]);
    let shift = (rb[t] - rb[u]) - (ra[t] - ra[u]);
    assert!(
        (shift + 1.25).abs() < 1e-4,
        "slot 1 shift at the drafted token: {shift}"
    );
    for w in (0..V).filter(|&w| w != t && w != u) {
        let other = (rb[w] - rb[u]) - (ra[w] - ra[u]);
        assert!(other.abs() < 1e-4, "id {w} moved by {other}");
    }
}

#[test]
fn greedy_blocks_stop_repeating_a_penalized_token() {
    let (_dir, d) = load(&Tiny::default());
    let s = state(&d);
    // A bias far above the other logits makes id 5 every slot's argmax ...
    let biased = ProposeOptions {
        logit_bias: Some(vec![vec![(5, 30.0)]]),
        ..ProposeOptions::default()
    };
    let a = d.propose_cached(&[&s], &[2], &biased).unwrap();
    assert!(a.tokens.iter().all(|&t| t == 5), "{:?}", a.tokens);
    // ... until drafting it costs more than the bias at the later slots.
    let opts = ProposeOptions {
        in_block: pen(0.0, 40.0, vec![]),
        guides: None,
        ..biased.clone()
    };
    let b = d.propose_cached(&[&s], &[2], &opts).unwrap();
    assert_eq!(b.tokens[0], 5);
    assert!(b.tokens[1..].iter().all(|&t| t != 5), "{:?}", b.tokens);
    for k in 0..b.slots {
        let row = &b.draft_logits[k * V..(k + 1) * V];
        assert_eq!(
            row[b.tokens[k] as usize], 0.0,
            "slot {k}: greedy rows are one-hot"
        );
    }
    // A presence penalty skips a token the request generated before the block.
    let seen = ProposeOptions {
        in_block: pen(40.0, 0.0, vec![5]),
        guides: None,
        ..biased.clone()
    };
    let c = d.propose_cached(&[&s], &[2], &seen).unwrap();
    assert_eq!(c.tokens, a.tokens);
    let fresh = ProposeOptions {
        in_block: pen(40.0, 0.0, vec![]),
        guides: None,
        ..biased
    };
    let e = d.propose_cached(&[&s], &[2], &fresh).unwrap();
    assert_eq!(e.tokens[0], 5);
    assert!(e.tokens[1..].iter().all(|&t| t != 5), "{:?}", e.tokens);
}

#[test]
fn an_inactive_option_drafts_the_plain_block() {
    let (_dir, d) = load(&Tiny::default());
    let s = state(&d);
    let plain = ProposeOptions {
        temperature: 0.8,
        seeds: Seeds::Scalar(4),
        ..ProposeOptions::default()
    };
    let a = d.propose_cached(&[&s], &[2], &plain).unwrap();
    let opts = ProposeOptions {
        in_block: pen(0.0, 0.0, vec![1, 2]),
        guides: None,
        ..plain.clone()
    };
    assert_eq!(d.propose_cached(&[&s], &[2], &opts).unwrap(), a);
}

#[test]
fn a_later_slot_is_drawn_from_the_distribution_it_reports() {
    // Over seeds, slot 1's tokens against the mean of the distributions it reported (each draw
    // conditioned on its own slot 0): the penalized rows are the ones drawn from.
    let (_dir, d) = load(&Tiny::default());
    let s = state(&d);
    let n = 3000u64;
    let mut counts = vec![0u64; V];
    let mut expected = vec![0f64; V];
    let mut repeats = 0;
    for i in 0..n {
        let opts = ProposeOptions {
            temperature: 1.0,
            seeds: Seeds::PerRequest(vec![i * 7919 + 1]),
            logit_bias: Some(vec![vec![(5, 3.0)]]),
            in_block: pen(1.0, 1.5, vec![]),
            guides: None,
            top_k: None,
        };
        let p = d.propose_cached(&[&s], &[2], &opts).unwrap();
        counts[p.tokens[1] as usize] += 1;
        repeats += usize::from(p.tokens[0] == p.tokens[1]);
        for (e, q) in expected.iter_mut().zip(softmax(&p.draft_logits[V..2 * V])) {
            *e += q / n as f64;
        }
    }
    assert_follows(&counts, &expected, "slot 1 under in-block penalties");
    assert!(
        repeats > 0,
        "the penalty lowers repeats, it does not forbid them"
    );
}
