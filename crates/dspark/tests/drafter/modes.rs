//! Drafting modes: the Markov chain and confidence head recomputed by hand from the block
//! hidden states, DFlash (`markov_rank = 0`), and the 1+K layout (`sample_from_anchor = false`).
use crate::drafter_common::{H, Tiny, context, load, max_diff};
use dspark::sampling::Seeds;
use dspark::{DraftState, Drafter, ProposeOptions};

fn state(d: &dspark::Qwen3Drafter, seed: u64, t: usize) -> DraftState {
    let mut s = d.new_state().unwrap();
    d.extend(&mut s, &context(seed, 1, t).get(0).unwrap(), 0)
        .unwrap();
    s
}

/// `(base [K·V_d], hidden [K·H])` of request 0.
fn base_and_hidden(d: &dspark::Qwen3Drafter, s: &DraftState, anchor: u32) -> (Vec<f32>, Vec<f32>) {
    let h = d.block_hidden(&[s], &[anchor]).unwrap();
    let base = d.base_logits(&h).unwrap();
    (
        base.flatten_all().unwrap().to_vec1().unwrap(),
        h.flatten_all().unwrap().to_vec1().unwrap(),
    )
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn markov_chain_and_confidence_by_hand() {
    let tiny = Tiny::default();
    let (_dir, d) = load(&tiny);
    let w = tiny.tensors();
    let (w1, w2) = (
        &w["markov_head.markov_w1.weight"].0,
        &w["markov_head.markov_w2.weight"].0,
    );
    let (cw, cb) = (
        &w["confidence_head.proj.weight"].0,
        w["confidence_head.proj.bias"].0[0],
    );
    let (r, v, k_n) = (tiny.rank, 48, d.info().num_draft_tokens);
    let s = state(&d, 3, 7);
    let anchor = 11u32;
    let (base, hidden) = base_and_hidden(&d, &s, anchor);
    for temperature in [0.0f32, 0.9] {
        let opts = ProposeOptions {
            logit_bias: None,
            in_block: None,
            guides: None,
            temperature,
            seeds: Seeds::Scalar(4),
            top_k: None,
        };
        let p = d.propose_cached(&[&s], &[anchor], &opts).unwrap();
        let conf = p.confidence.as_ref().unwrap();
        let mut prev = anchor as usize;
        for k in 0..k_n {
            let e = &w1[prev * r..(prev + 1) * r];
            let logits: Vec<f32> = (0..v)
                .map(|j| base[k * v + j] + dot(&w2[j * r..(j + 1) * r], e))
                .collect();
            let tok = p.tokens[k] as usize;
            let row = &p.draft_logits[k * v..(k + 1) * v];
            if temperature == 0.0 {
                let best = (0..v)
                    .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
                    .unwrap();
                assert_eq!(tok, best, "slot {k}");
            } else {
                // q is softmax(logits / T): compare log-probabilities.
                let scaled: Vec<f32> = logits.iter().map(|x| x / temperature).collect();
                let lse = |x: &[f32]| {
                    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                    m + x.iter().map(|y| (y - m).exp()).sum::<f32>().ln()
                };
                let (l1, l2) = (lse(&scaled), lse(row));
                let lp1: Vec<f32> = scaled.iter().map(|x| x - l1).collect();
                let lp2: Vec<f32> = row.iter().map(|x| x - l2).collect();
                assert!(max_diff(&lp1, &lp2) < 1e-4, "slot {k}");
            }
            let h = &hidden[k * H..(k + 1) * H];
            let z = dot(&cw[..H], h) + dot(&cw[H..], e) + cb;
            let c = 1.0 / (1.0 + (-z).exp());
            assert!(
                (conf[k] - c).abs() < 1e-5,
                "confidence slot {k}: {} vs {c}",
                conf[k]
            );
            prev = tok;
        }
    }
}

#[test]
fn dflash_mode_has_no_markov_bias() {
    let tiny = Tiny {
        rank: 0,
        confidence: false,
        ..Tiny::default()
    };
    let (_dir, d) = load(&tiny);
    assert_eq!(d.markov_rank(), 0);
    assert!(!d.info().has_confidence_head);
    let s = state(&d, 5, 6);
    let (base, _) = base_and_hidden(&d, &s, 2);
    let p = d
        .propose_cached(&[&s], &[2], &ProposeOptions::default())
        .unwrap();
    assert!(p.confidence.is_none());
    for (k, &tok) in p.tokens.iter().enumerate() {
        let row = &base[k * 48..(k + 1) * 48];
        let best = (0..48)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
            .unwrap();
        assert_eq!(tok as usize, best, "slot {k}");
    }
    // Sampling works at r = 0 too, and q is softmax(base / T).
    let opts = ProposeOptions {
        logit_bias: None,
        in_block: None,
        guides: None,
        temperature: 2.0,
        seeds: Seeds::Scalar(1),
        top_k: None,
    };
    let p = d.propose_cached(&[&s], &[2], &opts).unwrap();
    let diff = |k: usize, a: usize, b: usize| {
        let row = &p.draft_logits[k * 48..(k + 1) * 48];
        row[a] - row[b]
    };
    for k in 0..p.slots {
        let want = (base[k * 48 + 3] - base[k * 48 + 7]) / 2.0;
        assert!((diff(k, 3, 7) - want).abs() < 1e-4);
    }
}

#[test]
fn one_plus_k_layout_reads_slots_after_the_anchor() {
    // The 1+K drafter (K = block_size = 5) feeds `[anchor, M×5]` and reads slots 1..=5: the
    // same as slots 1.. of a DeepSpec-layout drafter with 6 slots and the same weights.
    let one_plus_k = Tiny {
        sample_from_anchor: Some(false),
        ..Tiny::default()
    };
    let wide_anchor = Tiny {
        block_size: 6,
        ..Tiny::default()
    };
    let (_d1, a) = load(&wide_anchor);
    let (_d2, b) = load(&one_plus_k);
    assert!(!b.info().sample_from_anchor);
    assert_eq!((b.info().block_size, b.info().num_draft_tokens), (5, 5));
    let (sa, sb) = (state(&a, 8, 5), state(&b, 8, 5));
    let flat = |t: candle_core::Tensor| -> Vec<f32> { t.flatten_all().unwrap().to_vec1().unwrap() };
    let ha = flat(a.block_hidden(&[&sa], &[9]).unwrap());
    let hb = flat(b.block_hidden(&[&sb], &[9]).unwrap());
    assert_eq!((ha.len(), hb.len()), (6 * H, 5 * H));
    assert!(max_diff(&ha[H..], &hb) < 1e-6);
    // And differs from the anchor layout's own slots 0..5.
    let (_d3, c) = load(&Tiny::default());
    let hc = flat(c.block_hidden(&[&state(&c, 8, 5)], &[9]).unwrap());
    assert!(max_diff(&hc, &hb) > 1e-3);
    let p = b
        .propose_cached(&[&sb], &[9], &ProposeOptions::default())
        .unwrap();
    assert_eq!((p.slots, p.tokens.len()), (5, 5));
    assert_eq!(p.confidence.unwrap().len(), 5);
}

#[test]
fn top_k_walk_restricts_support() {
    let (_dir, d) = load(&Tiny::default());
    let s = state(&d, 2, 4);
    let opts = ProposeOptions {
        logit_bias: None,
        in_block: None,
        guides: None,
        temperature: 1.0,
        seeds: Seeds::Scalar(9),
        top_k: Some(3),
    };
    let p = d.propose_cached(&[&s], &[1], &opts).unwrap();
    for row in p.draft_logits.chunks(48) {
        assert_eq!(row.iter().filter(|x| x.is_finite()).count(), 3);
    }
    let e = d
        .propose_cached(
            &[&s],
            &[1],
            &ProposeOptions {
                logit_bias: None,
                in_block: None,
                guides: None,
                top_k: Some(0),
                ..opts
            },
        )
        .unwrap_err();
    assert_eq!(e.code(), "invalid-argument");
}
