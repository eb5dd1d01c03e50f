//! Statistical losslessness of draft + verify: the emitted tokens follow the target distribution
//! (softmax at T, then top-k, then top-p) at positions 0 and 1, for greedy and probabilistic
//! drafts, full / padded / reduced vocabularies, dense and top-k drafting.
//!
//! The toy target is a first-order Markov chain over `V_t = 8` tokens; the drafter has its own
//! base logits and a rank-3 Markov head, so `q` differs from `p` everywhere. Each configuration
//! runs 50,000 independent trials (one batched call per round) and checks the joint distribution
//! of the first two emitted tokens with a chi-square test at alpha = 1e-4.

use crate::sampling_common::{TestRng, assert_follows, reference_probs};
use dspark::IdMap;
use dspark::sampling::{
    BlockOptions, Floats, Mat, PerRequest, Rows3, Seeds, Tokens, VerifyOptions,
    sample_block_slices, verify_slices,
};

const VT: usize = 8;
const K: usize = 2;
const R: usize = 3;
const TRIALS: usize = 50_000;

#[derive(Clone, Copy, Debug)]
enum Vocab {
    Full,
    Padded,
    Reduced,
}

struct Toy {
    vd: usize,
    vin: usize,
    id_map: IdMap,
    /// `[V_t, V_t]` target transition logits: row `a` = logits of the token after `a`.
    trans: Vec<f32>,
    /// `[V_t, K, V_d]` draft base logits per anchor.
    base: Vec<f32>,
    w1: Vec<f32>,
    w2: Vec<f32>,
}

fn toy(vocab: Vocab, seed: u64) -> Toy {
    let mut rng = TestRng(seed);
    let (vd, vin, id_map) = match vocab {
        Vocab::Full => (VT, VT, IdMap::identity(VT).unwrap()),
        Vocab::Padded => (12, 12, IdMap::identity(VT).unwrap()),
        Vocab::Reduced => {
            let targets = [0i64, 2, 3, 5, 7];
            let offsets: Vec<i64> = targets
                .iter()
                .enumerate()
                .map(|(d, &t)| t - d as i64)
                .collect();
            (5, VT, IdMap::from_offsets(&offsets, 5, VT).unwrap())
        }
    };
    let trans = rng.normals(VT * VT, 1.0);
    let mut base = rng.normals(VT * K * vd, 1.5);
    let w1 = rng.normals(vin * R, 0.7);
    let mut w2 = rng.normals(vd * R, 0.7);
    if vd > VT {
        // Padded columns would win every argmax and sample if they were not masked.
        for row in base.chunks_mut(vd) {
            row[VT..].fill(1.0e4);
        }
        for row in w2.chunks_mut(R).skip(VT) {
            row.fill(50.0);
        }
    }
    Toy {
        vd,
        vin,
        id_map,
        trans,
        base,
        w1,
        w2,
    }
}

#[derive(Clone, Copy, Debug)]
struct Cfg {
    vocab: Vocab,
    draft_t: f32,
    target_t: f32,
    top_k: Option<usize>,
    top_p: f32,
    draft_top_k: Option<usize>,
    /// Pass the recorded draft logits to verify (else one-hot q).
    pass_q: bool,
}

/// One speculative round for every trial: returns the emitted tokens of each.
fn round(toy: &Toy, cfg: &Cfg, anchors: &[u32], seed: u64) -> Vec<Vec<i64>> {
    let n = anchors.len();
    let mut base = Vec::with_capacity(n * K * toy.vd);
    for &a in anchors {
        base.extend_from_slice(&toy.base[a as usize * K * toy.vd..(a as usize + 1) * K * toy.vd]);
    }
    let block = sample_block_slices(
        Rows3::new(Floats::F32(&base), [n, K, toy.vd]).unwrap(),
        Mat::new(Floats::F32(&toy.w1), [toy.vin, R]).unwrap(),
        Mat::new(Floats::F32(&toy.w2), [toy.vd, R]).unwrap(),
        anchors,
        &BlockOptions {
            temperature: cfg.draft_t,
            seeds: Seeds::Scalar(seed),
            id_map: &toy.id_map,
            top_k: cfg.draft_top_k,
            logit_scale: 1.0,
        },
    )
    .unwrap();
    let mut target = Vec::with_capacity(n * (K + 1) * VT);
    for (i, &a) in anchors.iter().enumerate() {
        let mut prev = a as usize;
        for slot in 0..=K {
            target.extend_from_slice(&toy.trans[prev * VT..(prev + 1) * VT]);
            if slot < K {
                prev = block.tokens[i * K + slot] as usize;
                assert!(prev < VT, "drafted id {prev} outside the target vocabulary");
            }
        }
    }
    let drafts: Vec<i64> = block.tokens.iter().map(|&t| i64::from(t)).collect();
    let q = cfg
        .pass_q
        .then(|| Rows3::new(Floats::F32(&block.draft_logits), [n, K, VT]).unwrap());
    let v = verify_slices(
        Rows3::new(Floats::F32(&target), [n, K + 1, VT]).unwrap(),
        Tokens::new(&drafts, [n, K]).unwrap(),
        q,
        &VerifyOptions {
            temperature: PerRequest::All(cfg.target_t),
            top_k: PerRequest::All(cfg.top_k),
            top_p: PerRequest::All(cfg.top_p),
            // The same seed as the drafter: tags keep the streams independent.
            seeds: Seeds::Scalar(seed),
            num_draft: None,
            stop_token_ids: vec![],
        },
    )
    .unwrap();
    (0..n).map(|i| v.emitted(i).to_vec()).collect()
}

fn check(cfg: Cfg, seed: u64, trials: usize) {
    let toy = toy(cfg.vocab, seed);
    let a0 = 1u32;
    let first = round(&toy, &cfg, &vec![a0; trials], seed ^ 0xabc);
    let mut pairs: Vec<(usize, Option<usize>)> = first
        .iter()
        .map(|e| (e[0] as usize, e.get(1).map(|&t| t as usize)))
        .collect();
    // Trials that emitted one token need a second round anchored on it.
    let pending: Vec<usize> = (0..trials).filter(|&i| pairs[i].1.is_none()).collect();
    let anchors: Vec<u32> = pending.iter().map(|&i| pairs[i].0 as u32).collect();
    let second = round(&toy, &cfg, &anchors, seed ^ 0xdef);
    for (j, &i) in pending.iter().enumerate() {
        pairs[i].1 = Some(second[j][0] as usize);
    }
    let mut counts = vec![0u64; VT * VT];
    for (t0, t1) in pairs {
        counts[t0 * VT + t1.unwrap()] += 1;
    }
    let p = |row: usize| {
        reference_probs(
            &toy.trans[row * VT..(row + 1) * VT],
            cfg.target_t,
            cfg.top_k,
            cfg.top_p,
        )
    };
    let p0 = p(a0 as usize);
    let mut joint = vec![0.0; VT * VT];
    for t0 in 0..VT {
        let p1 = p(t0);
        for t1 in 0..VT {
            joint[t0 * VT + t1] = p0[t0] * p1[t1];
        }
    }
    assert_follows(&counts, &joint, &format!("{cfg:?}"));
}

fn cfg(vocab: Vocab, draft_t: f32, target_t: f32) -> Cfg {
    Cfg {
        vocab,
        draft_t,
        target_t,
        top_k: None,
        top_p: 1.0,
        draft_top_k: None,
        pass_q: draft_t > 0.0,
    }
}

const VOCABS: [Vocab; 3] = [Vocab::Full, Vocab::Padded, Vocab::Reduced];

#[test]
fn probabilistic_drafts_are_lossless_at_t1_and_t07() {
    for (i, vocab) in VOCABS.into_iter().enumerate() {
        check(cfg(vocab, 1.0, 1.0), 11 + i as u64, TRIALS);
        check(cfg(vocab, 0.7, 0.7), 21 + i as u64, TRIALS);
    }
}

#[test]
fn greedy_drafts_are_lossless_with_one_hot_q() {
    for (i, vocab) in VOCABS.into_iter().enumerate() {
        check(cfg(vocab, 0.0, 1.0), 31 + i as u64, TRIALS);
    }
    // One-hot q passed explicitly as recorded draft logits (0 at the argmax, -inf elsewhere).
    let explicit = Cfg {
        pass_q: true,
        ..cfg(Vocab::Padded, 0.0, 0.7)
    };
    check(explicit, 41, TRIALS);
}

#[test]
fn greedy_targets_emit_exactly_the_argmax_chain() {
    // Deterministic: every trial must match (any other token has probability 0).
    for (i, vocab) in VOCABS.into_iter().enumerate() {
        check(cfg(vocab, 0.0, 0.0), 51 + i as u64, 2_000);
        check(cfg(vocab, 1.0, 0.0), 61 + i as u64, 2_000);
    }
}

#[test]
fn target_top_k_and_top_p_are_respected() {
    let top_k = Cfg {
        top_k: Some(3),
        ..cfg(Vocab::Full, 1.0, 0.7)
    };
    let top_p = Cfg {
        top_p: 0.8,
        ..cfg(Vocab::Padded, 1.0, 0.7)
    };
    let both = Cfg {
        top_k: Some(5),
        top_p: 0.7,
        ..cfg(Vocab::Reduced, 0.0, 1.0)
    };
    check(top_k, 71, TRIALS);
    check(top_p, 81, TRIALS);
    check(both, 91, TRIALS);
}

#[test]
fn drafting_within_base_top_k_is_lossless() {
    for (i, vocab) in [Vocab::Full, Vocab::Reduced].into_iter().enumerate() {
        let c = Cfg {
            draft_top_k: Some(2),
            ..cfg(vocab, 1.0, 1.0)
        };
        check(c, 101 + i as u64, TRIALS);
    }
}
