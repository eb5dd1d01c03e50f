//! The kernels' adversarial suite: arbitrary shapes (zero-size and huge), dtypes, odd values
//! (NaN, ±inf, huge, negative) and ids into every public kernel entry point. Each case has
//! exactly two acceptable outcomes: a typed error with an expected code, or a result that
//! satisfies the documented contract (every token in `[0, V_t)` or `-1` where padding is
//! documented; the same inputs give the same outputs).
//!
//! Deterministic: a fixed ChaCha seed and a bounded case count (no persistence files), so CI
//! runs the same cases every time.

use crate::sampling_common::held::Held;
use dspark::policy::{StepsPerSecond, schedule_lengths, schedule_pipelined, threshold_lengths};
use dspark::sampling::{
    BlockOptions, Floats, Mat, PerRequest, Rows3, Seeds, Tokens, VerifyOptions, confidence_slices,
    mask_padded_slice, sample_block_slices, verify_slices,
};
use dspark::{Error, IdMap, VocabSizes};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// A runner with a fixed seed (salted per property) and `cases` cases.
fn runner(cases: u32, salt: u8) -> TestRunner {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut seed = [0x5a; 32];
    seed[0] = salt;
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed))
}

/// Odd and ordinary values.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => -4.0f32..4.0,
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(f32::MAX),
        1 => Just(-1e30f32),
        1 => Just(0.0f32),
    ]
}

/// Mostly-finite values: a NaN/inf in one of `1 / rare` cases.
fn values(n: usize, rare: u32) -> impl Strategy<Value = Vec<f32>> {
    (
        proptest::collection::vec(-4.0f32..4.0, n),
        proptest::collection::vec(value(), n),
        0..rare,
    )
        .prop_map(|(plain, odd, pick)| if pick == 0 { odd } else { plain })
}

/// A dimension: mostly small, sometimes huge (the data is then mismatched or empty).
fn dim(max: usize) -> impl Strategy<Value = usize> {
    prop_oneof![
        8 => 0..=max,
        1 => Just(1usize << 33),
        1 => Just(usize::MAX),
    ]
}

fn expect_code(e: &Error, allowed: &[&str], what: &str) -> Result<(), TestCaseError> {
    prop_assert!(
        allowed.contains(&e.code()),
        "{what}: unexpected error code {}: {e}",
        e.code()
    );
    Ok(())
}

const INPUT_CODES: &[&str] = &[
    "bad-shape",
    "invalid-argument",
    "non-finite",
    "token-out-of-range",
    "too-large",
];

#[derive(Debug, Clone)]
struct BlockCase {
    dims: [usize; 3],
    vin: usize,
    rank: usize,
    dtype: u8,
    base: Vec<f32>,
    w1: Vec<f32>,
    w2: Vec<f32>,
    anchors: Vec<u32>,
    temperature: f32,
    scale: f32,
    top_k: Option<usize>,
    map: Result<IdMap, String>,
    per_request: bool,
}

fn block_case() -> impl Strategy<Value = BlockCase> {
    (dim(3), dim(3), dim(12), 0usize..15, 0usize..5, any::<u8>()).prop_flat_map(
        |(b, k, vd, vin, rank, dtype)| {
            let small = |d: usize| if d > 64 { 0 } else { d };
            let n = small(b) * small(k) * small(vd);
            (
                values(n, 4),
                values(vin * rank, 8),
                values(small(vd) * rank, 8),
                proptest::collection::vec(0u32..16, small(b)),
                prop_oneof![
                    Just(0.0f32),
                    Just(0.7),
                    Just(1e-30),
                    Just(-1.0),
                    Just(f32::NAN)
                ],
                prop_oneof![4 => Just(1.0f32), 1 => Just(0.0), 1 => Just(f32::INFINITY)],
                prop_oneof![Just(None), Just(Some(0usize)), Just(Some(1)), Just(Some(3))],
                map_case(small(vd)),
                any::<bool>(),
            )
                .prop_map(
                    move |(base, w1, w2, anchors, temperature, scale, top_k, map, per_request)| {
                        BlockCase {
                            dims: [b, k, vd],
                            vin,
                            rank,
                            dtype,
                            base,
                            w1,
                            w2,
                            anchors,
                            temperature,
                            scale,
                            top_k,
                            map,
                            per_request,
                        }
                    },
                )
        },
    )
}

/// An id map: identity over a small, limit-sized or huge vocabulary, or a random table.
fn map_case(vd: usize) -> impl Strategy<Value = Result<IdMap, String>> {
    let identity = prop_oneof![
        4 => 0usize..14,
        1 => Just(1usize << 22),
        1 => Just((1usize << 22) + 1),
        1 => Just(1usize << 33),
    ]
    .prop_map(|vt| IdMap::identity(vt).map_err(|e| e.code().to_string()));
    let table = (proptest::collection::vec(-3i64..6, vd), 0usize..16)
        .prop_map(move |(o, vt)| IdMap::from_offsets(&o, vd, vt).map_err(|e| e.code().to_string()));
    prop_oneof![identity, table]
}

fn check_block(c: &BlockCase) -> Result<(), TestCaseError> {
    let map = match &c.map {
        Ok(m) => m,
        Err(code) => {
            let allowed = ["too-large", "d2t-out-of-range", "d2t-duplicate", "multiple"];
            prop_assert!(allowed.contains(&code.as_str()), "id map: {code}");
            return Ok(());
        }
    };
    let base = Held::new(c.base.clone(), c.dtype.into());
    let w1 = Held::new(c.w1.clone(), (c.dtype / 3).into());
    let w2 = Held::new(c.w2.clone(), (c.dtype / 9).into());
    let seeds = if c.per_request {
        Seeds::PerRequest((0..c.anchors.len() as u64).collect())
    } else {
        Seeds::Scalar(3)
    };
    let opts = BlockOptions {
        temperature: c.temperature,
        seeds,
        id_map: map,
        top_k: c.top_k,
        logit_scale: c.scale,
    };
    let run = || {
        sample_block_slices(
            Rows3 {
                data: base.floats(),
                dims: c.dims,
            },
            Mat {
                data: w1.floats(),
                dims: [c.vin, c.rank],
            },
            Mat {
                data: w2.floats(),
                dims: [c.dims[2], c.rank],
            },
            &c.anchors,
            &opts,
        )
    };
    match run() {
        Err(e) => expect_code(&e, INPUT_CODES, "sample_block")?,
        Ok(block) => {
            let vt = map.target_vocab();
            let [b, k, _] = c.dims;
            prop_assert_eq!(block.tokens.len(), b * k);
            prop_assert_eq!(block.draft_logits.len(), b * k * vt);
            prop_assert_eq!(block.prev_embeddings.len(), b * k * c.rank);
            let greedy = !(c.scale / c.temperature).is_finite();
            for (i, &t) in block.tokens.iter().enumerate() {
                prop_assert!((t as usize) < vt, "token {t} outside [0, {vt})");
                let row = &block.draft_logits[i * vt..(i + 1) * vt];
                prop_assert!(row[t as usize].is_finite(), "token drawn from a -inf entry");
                prop_assert!(row.iter().all(|x| !x.is_nan() && *x != f32::INFINITY));
                if greedy {
                    prop_assert_eq!(row[t as usize], 0.0);
                }
            }
            // Deterministic: the same inputs give the same block.
            prop_assert_eq!(run().ok(), Some(block));
        }
    }
    Ok(())
}

#[test]
fn sample_block_gives_typed_errors_or_valid_blocks() {
    runner(384, 1)
        .run(&block_case(), |c| check_block(&c))
        .unwrap();
}

#[derive(Debug, Clone)]
struct VerifyCase {
    dims: [usize; 3],
    token_dims: [usize; 2],
    dtype: u8,
    target: Vec<f32>,
    drafts: Vec<i64>,
    q: Option<Vec<f32>>,
    temperature: PerRequest<f32>,
    top_k: Option<usize>,
    top_p: f32,
    num_draft: Option<Vec<usize>>,
    stops: Vec<u32>,
}

fn verify_case() -> impl Strategy<Value = VerifyCase> {
    (dim(3), 0usize..4, dim(7), any::<u8>(), 0u8..4).prop_flat_map(|(b, k1, v, dtype, shape)| {
        let small = |d: usize| if d > 64 { 0 } else { d };
        let (bs, vs) = (small(b), small(v));
        let k = k1.saturating_sub(1);
        let token_dims = match shape {
            0 => [k, b], // transposed
            1 => [b, k + 1],
            _ => [b, k],
        };
        let nt = small(token_dims[0]) * small(token_dims[1]);
        (
            values(bs * k1 * vs, 4),
            proptest::collection::vec(-1i64..9, nt),
            proptest::option::of(values(bs * k * vs, 4)),
            prop_oneof![
                Just(PerRequest::All(0.0f32)),
                Just(PerRequest::All(1.0)),
                Just(PerRequest::All(f32::NAN)),
                Just(PerRequest::Each(vec![0.5; bs])),
                Just(PerRequest::Each(vec![0.5; bs + 1])),
            ],
            prop_oneof![Just(None), Just(Some(0usize)), Just(Some(2))],
            prop_oneof![Just(1.0f32), Just(0.5), Just(0.0), Just(f32::NAN)],
            proptest::option::of(proptest::collection::vec(0usize..5, bs)),
            proptest::collection::vec(0u32..9, 0..3),
        )
            .prop_map(
                move |(target, drafts, q, temperature, top_k, top_p, num_draft, stops)| {
                    VerifyCase {
                        dims: [b, k1, v],
                        token_dims,
                        dtype,
                        target,
                        drafts,
                        q,
                        temperature,
                        top_k,
                        top_p,
                        num_draft,
                        stops,
                    }
                },
            )
    })
}

fn check_verify(c: &VerifyCase) -> Result<(), TestCaseError> {
    let target = Held::new(c.target.clone(), c.dtype.into());
    let [b, k1, v] = c.dims;
    let k = k1.saturating_sub(1);
    let opts = VerifyOptions {
        temperature: c.temperature.clone(),
        top_k: PerRequest::All(c.top_k),
        top_p: PerRequest::All(c.top_p),
        seeds: Seeds::Scalar(11),
        num_draft: c.num_draft.clone(),
        stop_token_ids: c.stops.clone(),
    };
    let run = || {
        verify_slices(
            Rows3 {
                data: target.floats(),
                dims: c.dims,
            },
            Tokens {
                data: &c.drafts,
                dims: c.token_dims,
            },
            c.q.as_ref().map(|q| Rows3 {
                data: Floats::F32(q),
                dims: [b, k, v],
            }),
            &opts,
        )
    };
    match run() {
        Err(e) => expect_code(&e, INPUT_CODES, "verify")?,
        Ok(out) => {
            prop_assert_eq!(
                c.token_dims,
                [b, k],
                "accepted draft tokens that are not [B, K]"
            );
            prop_assert_eq!((out.batch, out.width), (b, k1));
            prop_assert_eq!(out.tokens.len(), b * k1);
            for r in 0..b {
                let row = &out.tokens[r * k1..(r + 1) * k1];
                let n = row.iter().position(|&t| t < 0).unwrap_or(k1);
                prop_assert!(n >= 1 || k1 == 0, "nothing emitted");
                prop_assert!(row[..n].iter().all(|&t| (t as usize) < v));
                prop_assert!(row[n..].iter().all(|&t| t == -1), "padding is -1");
                let acc = out.num_accepted[r] as usize;
                prop_assert!(acc <= k && acc <= n);
                prop_assert_eq!(&row[..acc], &c.drafts[r * k..r * k + acc]);
            }
            prop_assert_eq!(run().ok(), Some(out));
        }
    }
    Ok(())
}

#[test]
fn verify_gives_typed_errors_or_valid_rounds() {
    runner(384, 2)
        .run(&verify_case(), |c| check_verify(&c))
        .unwrap();
}

#[derive(Debug, Clone)]
struct ConfCase {
    dims: [usize; 3],
    weight_shape: Vec<usize>,
    dtype: u8,
    hidden: Vec<f32>,
    prev: Option<Vec<f32>>,
    weight: Vec<f32>,
    bias: f32,
}

fn conf_case() -> impl Strategy<Value = ConfCase> {
    (dim(3), dim(3), dim(6), 0usize..4, 0u8..5, any::<u8>()).prop_flat_map(
        |(b, k, h, rank, shape, dtype)| {
            let small = |d: usize| if d > 64 { 0 } else { d };
            let (bk, hs) = (small(b) * small(k), small(h));
            let n = hs + rank;
            let weight_shape = match shape {
                0 => vec![n],
                1 => vec![1, n],
                2 => vec![n, 1],
                3 => vec![2, n / 2],
                _ => vec![1, 1, n],
            };
            (
                values(bk * hs, 6),
                proptest::option::of(values(bk * rank, 6)),
                values(n, 8),
                prop_oneof![4 => Just(0.25f32), 1 => Just(f32::NAN), 1 => Just(f32::INFINITY)],
            )
                .prop_map(move |(hidden, prev, weight, bias)| ConfCase {
                    dims: [b, k, h],
                    weight_shape: weight_shape.clone(),
                    dtype,
                    hidden,
                    prev,
                    weight,
                    bias,
                })
        },
    )
}

fn check_conf(c: &ConfCase) -> Result<(), TestCaseError> {
    let hidden = Held::new(c.hidden.clone(), c.dtype.into());
    let weight = Held::new(c.weight.clone(), (c.dtype / 3).into());
    let prev = c.prev.as_deref();
    let got = confidence_slices(
        Rows3 {
            data: hidden.floats(),
            dims: c.dims,
        },
        prev,
        weight.floats(),
        &c.weight_shape,
        c.bias,
        None,
    );
    match got {
        Err(e) => expect_code(&e, INPUT_CODES, "confidence")?,
        Ok(out) => {
            let n = c.weight.len();
            let ok_shape = c.weight_shape == [n] || c.weight_shape == [1, n];
            prop_assert!(ok_shape, "weight of shape {:?} accepted", c.weight_shape);
            prop_assert_eq!(out.len(), c.dims[0] * c.dims[1]);
            prop_assert!(out.iter().all(|x| (0.0..=1.0).contains(x)), "{out:?}");
            let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
            prop_assert!(finite(&c.weight) && c.bias.is_finite());
            // Non-finite inputs are refused (f16/bf16 may overflow finite values to inf).
            if matches!(hidden, Held::F32(_)) {
                prop_assert!(finite(&c.hidden), "non-finite hidden accepted");
            }
            prop_assert!(prev.is_none_or(finite), "non-finite embeddings accepted");
        }
    }
    Ok(())
}

#[test]
fn confidence_gives_typed_errors_or_probabilities() {
    runner(384, 3)
        .run(&conf_case(), |c| check_conf(&c))
        .unwrap();
}

#[test]
fn schedules_give_typed_errors_or_lengths_within_the_block() {
    let case = (
        dim(4),
        dim(4),
        -1i32..2,
        values(32, 3),
        prop_oneof![Just(0.5f32), Just(f32::NAN), Just(-1.0)],
    );
    runner(256, 4)
        .run(&case, |(b, k, skew, c, threshold)| {
            let n = (b.saturating_mul(k) as i64 + i64::from(skew)).clamp(0, 32) as usize;
            let c = &c[..n];
            let sps = StepsPerSecond::linear(vec![(1, 50.0), (8, 40.0)]).unwrap();
            for got in [
                threshold_lengths(c, b, k, threshold),
                schedule_lengths(c, b, k, &sps),
                schedule_pipelined(c, c, b, k, &sps),
            ] {
                match got {
                    Err(e) => expect_code(&e, INPUT_CODES, "schedule")?,
                    Ok(lengths) => {
                        prop_assert_eq!(Some(n), b.checked_mul(k));
                        prop_assert_eq!(lengths.len(), b);
                        prop_assert!(lengths.iter().all(|&l| l <= k));
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn id_maps_never_truncate_ids() {
    let vocab = prop_oneof![
        0usize..20,
        Just(1usize << 22),
        Just((1usize << 22) + 1),
        Just(1usize << 32),
        Just(1usize << 33),
        Just(usize::MAX),
    ];
    let id = prop_oneof![
        0usize..40,
        Just(1usize << 32),
        Just((1usize << 32) + 5),
        Just(usize::MAX)
    ];
    runner(256, 5)
        .run(
            &(vocab.clone(), vocab, proptest::collection::vec(id, 4)),
            |(vt, vd, ids)| {
                match IdMap::identity(vt) {
                    Err(e) => expect_code(&e, &["too-large"], "identity")?,
                    Ok(m) => {
                        for &d in &ids {
                            match m.to_target(d) {
                                Some(t) => prop_assert!(t as usize == d && d < vt),
                                None => prop_assert!(d >= vt),
                            }
                        }
                    }
                }
                match VocabSizes::try_new(vt, vd, vt) {
                    Err(e) => expect_code(&e, &["too-large"], "vocab sizes")?,
                    Ok(v) => prop_assert!(v.target <= 1 << 22 && v.draft <= 1 << 22),
                }
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn mask_gives_typed_errors_or_masks_exactly_the_tail() {
    runner(128, 6)
        .run(&(0usize..20, dim(6), dim(8)), |(len, cols, valid)| {
            let mut data = vec![1.0f32; len];
            match mask_padded_slice(&mut data, cols, valid) {
                Err(e) => expect_code(&e, INPUT_CODES, "mask")?,
                Ok(()) => {
                    for (i, &x) in data.iter().enumerate() {
                        prop_assert_eq!(x.is_finite(), i % cols < valid);
                    }
                }
            }
            Ok(())
        })
        .unwrap();
}
