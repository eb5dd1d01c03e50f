//! The Markov block sampler: exact recorded q, padded-column masking, reference equivalence,
//! top-k walk, dtype handling, order independence and typed errors.

use crate::sampling_common::{TestRng, assert_follows, histogram, softmax};
use dspark::IdMap;
use dspark::sampling::{
    BlockOptions, DraftBlock, Floats, Mat, Rows3, Seeds, sample_block, sample_block_slices,
};

struct Inputs {
    b: usize,
    k: usize,
    vd: usize,
    vin: usize,
    r: usize,
    base: Vec<f32>,
    w1: Vec<f32>,
    w2: Vec<f32>,
    anchors: Vec<u32>,
}

fn inputs(b: usize, k: usize, vd: usize, vin: usize, r: usize, seed: u64) -> Inputs {
    let mut rng = TestRng(seed);
    Inputs {
        b,
        k,
        vd,
        vin,
        r,
        base: rng.normals(b * k * vd, 1.5),
        w1: rng.normals(vin * r, 0.8),
        w2: rng.normals(vd * r, 0.8),
        anchors: (0..b).map(|i| (i * 7 % vin.min(vd)) as u32).collect(),
    }
}

fn opts(
    t: f32,
    seeds: Seeds,
    id_map: &IdMap,
    top_k: Option<usize>,
    scale: f32,
) -> BlockOptions<'_> {
    BlockOptions {
        temperature: t,
        seeds,
        id_map,
        top_k,
        logit_scale: scale,
    }
}

fn run(x: &Inputs, o: &BlockOptions<'_>) -> dspark::Result<DraftBlock> {
    sample_block_slices(
        Rows3 {
            data: Floats::F32(&x.base),
            dims: [x.b, x.k, x.vd],
        },
        Mat {
            data: Floats::F32(&x.w1),
            dims: [x.vin, x.r],
        },
        Mat {
            data: Floats::F32(&x.w2),
            dims: [x.vd, x.r],
        },
        &x.anchors,
        o,
    )
}

/// f64 reference logits of slot k of request b given the previous target id.
fn reference_logits(x: &Inputs, b: usize, k: usize, prev: usize, scale: f64) -> Vec<f64> {
    (0..x.vd)
        .map(|d| {
            let bias: f64 = (0..x.r)
                .map(|j| f64::from(x.w2[d * x.r + j]) * f64::from(x.w1[prev * x.r + j]))
                .sum();
            scale * (f64::from(x.base[(b * x.k + k) * x.vd + d]) + bias)
        })
        .collect()
}

#[test]
fn greedy_matches_a_sequential_reference() {
    // V_d spans several 256-wide blocks; V_t < V_d (padded), so the mask matters.
    let x = inputs(3, 4, 700, 700, 5, 1);
    let map = IdMap::identity(650).unwrap();
    let out = run(&x, &opts(0.0, Seeds::Scalar(0), &map, None, 0.5)).unwrap();
    each_slot(&x, &out, 0.5, 650, |b, k, prev, l, row| {
        let want = (0..650).fold(0, |best, d| if l[d] > l[best] { d } else { best });
        assert_eq!(out.tokens[b * x.k + k] as usize, want, "b {b} k {k}");
        let e = &out.prev_embeddings[(b * x.k + k) * x.r..(b * x.k + k + 1) * x.r];
        assert_eq!(e, &x.w1[prev * x.r..(prev + 1) * x.r]);
        for (d, &v) in row.iter().enumerate() {
            assert_eq!(v, if d == want { 0.0 } else { f32::NEG_INFINITY });
        }
        want
    });
}

/// Every slot `(b, k)` of `out` in order: `check(b, k, prev, reference logits at scale,
/// recorded row of width)` checks it and returns its token, the next slot's `prev`.
fn each_slot(
    x: &Inputs,
    out: &DraftBlock,
    scale: f64,
    width: usize,
    mut check: impl FnMut(usize, usize, usize, &[f64], &[f32]) -> usize,
) {
    for b in 0..x.b {
        let mut prev = x.anchors[b] as usize;
        for k in 0..x.k {
            let l = reference_logits(x, b, k, prev, scale);
            let row = &out.draft_logits[(b * x.k + k) * width..(b * x.k + k + 1) * width];
            prev = check(b, k, prev, &l, row);
        }
    }
}

#[test]
fn vanishing_temperatures_draft_greedily() {
    // Below `GREEDY_BELOW` (1e-5) a draft is the argmax: at 1e-38, `scale / T` is finite but
    // the scaled logits would overflow f32 and fail the row.
    let x = inputs(2, 3, 300, 300, 4, 3);
    let map = IdMap::identity(300).unwrap();
    let want = run(&x, &opts(0.0, Seeds::Scalar(0), &map, None, 1.0)).unwrap();
    for t in [1e-38f32, 1e-12, 9.9e-6] {
        let got = run(&x, &opts(t, Seeds::Scalar(5), &map, None, 1.0)).unwrap();
        assert_eq!(got, want, "T {t}");
    }
}

#[test]
fn sampled_rows_record_scaled_biased_logits_over_temperature() {
    let x = inputs(4, 3, 300, 300, 4, 2);
    let map = IdMap::identity(300).unwrap();
    let out = run(&x, &opts(0.7, Seeds::Scalar(5), &map, None, 1.3)).unwrap();
    each_slot(&x, &out, 1.3 / 0.7, 300, |b, k, _, l, row| {
        for d in 0..300 {
            assert!((f64::from(row[d]) - l[d]).abs() < 1e-4 * l[d].abs().max(1.0));
        }
        out.tokens[b * x.k + k] as usize
    });
}

#[test]
fn recorded_q_matches_the_empirical_draft_distribution() {
    let n = 50_000;
    let mut x = inputs(1, 2, 8, 8, 3, 3);
    // Every request has the same base logits and anchor: slot 0 has one q, slot 1 one per x_1.
    let row = x.base.clone();
    x.base = row.iter().cycle().take(n * 2 * 8).cloned().collect();
    x.anchors = vec![2; n];
    x.b = n;
    let map = IdMap::identity(8).unwrap();
    let out = run(&x, &opts(0.8, Seeds::Scalar(9), &map, None, 1.0)).unwrap();
    let q0 = softmax(&out.draft_logits[..8]);
    for i in 0..n {
        assert_eq!(
            &out.draft_logits[i * 16..i * 16 + 8],
            &out.draft_logits[..8]
        );
    }
    let slot0 = histogram((0..n).map(|i| out.tokens[i * 2] as usize), 8);
    assert_follows(&slot0, &q0, "slot 0");
    for x1 in 0..8 {
        let rows: Vec<usize> = (0..n)
            .filter(|&i| out.tokens[i * 2] as usize == x1)
            .collect();
        if rows.len() < 2_000 {
            continue;
        }
        let q = &out.draft_logits[rows[0] * 16 + 8..rows[0] * 16 + 16];
        let counts = histogram(rows.iter().map(|&i| out.tokens[i * 2 + 1] as usize), 8);
        assert_follows(&counts, &softmax(q), &format!("slot 1 after {x1}"));
    }
}

#[test]
fn padded_columns_never_come_out() {
    // V_t = 8 inside V_d = 16; padded base columns and W2 rows are huge.
    let mut x = inputs(2_000, 3, 16, 16, 3, 4);
    for row in x.base.chunks_mut(16) {
        row[8..].fill(1.0e6);
    }
    for row in x.w2.chunks_mut(3).skip(8) {
        row.fill(1.0e3);
    }
    x.anchors = (0..x.b).map(|i| (i % 8) as u32).collect();
    let map = IdMap::identity(8).unwrap();
    for (t, top_k) in [(0.0, None), (1.0, None), (1.0, Some(3)), (0.0, Some(2))] {
        let out = run(&x, &opts(t, Seeds::Scalar(1), &map, top_k, 1.0)).unwrap();
        assert!(out.tokens.iter().all(|&t| t < 8), "T={t} top_k={top_k:?}");
        assert_eq!(out.draft_logits.len(), x.b * 3 * 8);
        assert!(
            out.draft_logits
                .iter()
                .all(|v| v.is_finite() || *v == f32::NEG_INFINITY)
        );
    }
    // Reduced map: only mapped ids, and q is -inf on unmapped target columns.
    let x = inputs(500, 2, 4, 10, 3, 5);
    let map = IdMap::from_offsets(&[1, 2, 3, 6], 4, 10).unwrap(); // targets 1, 3, 5, 9
    let out = run(&x, &opts(1.0, Seeds::Scalar(2), &map, None, 1.0)).unwrap();
    assert!(out.tokens.iter().all(|t| [1, 3, 5, 9].contains(t)));
    for row in out.draft_logits.chunks(10) {
        for (c, v) in row.iter().enumerate() {
            assert_eq!(v.is_finite(), [1, 3, 5, 9].contains(&c), "column {c}");
        }
    }
}

#[test]
fn top_k_walk_biases_only_the_base_top_k() {
    let x = inputs(3, 2, 40, 40, 4, 6);
    let map = IdMap::identity(40).unwrap();
    let out = run(&x, &opts(1.0, Seeds::Scalar(3), &map, Some(5), 2.0)).unwrap();
    for b in 0..x.b {
        let mut prev = x.anchors[b] as usize;
        for k in 0..x.k {
            let base = &x.base[(b * x.k + k) * 40..(b * x.k + k + 1) * 40];
            let mut ids: Vec<usize> = (0..40).collect();
            ids.sort_by(|&i, &j| base[j].total_cmp(&base[i]).then(i.cmp(&j)));
            ids.truncate(5);
            let l = reference_logits(&x, b, k, prev, 2.0);
            let row = &out.draft_logits[(b * x.k + k) * 40..(b * x.k + k + 1) * 40];
            for d in 0..40 {
                if ids.contains(&d) {
                    assert!((f64::from(row[d]) - l[d]).abs() < 1e-4 * l[d].abs().max(1.0));
                } else {
                    assert_eq!(row[d], f32::NEG_INFINITY);
                }
            }
            assert!(ids.contains(&(out.tokens[b * x.k + k] as usize)));
            prev = out.tokens[b * x.k + k] as usize;
        }
    }
    // k >= V is the dense path.
    let dense = run(&x, &opts(1.0, Seeds::Scalar(3), &map, None, 2.0)).unwrap();
    let full = run(&x, &opts(1.0, Seeds::Scalar(3), &map, Some(40), 2.0)).unwrap();
    assert_eq!(dense, full);
}

#[test]
fn half_precision_inputs_match_f32_on_the_rounded_values() {
    let x = inputs(4, 3, 520, 520, 8, 7);
    let map = IdMap::identity(500).unwrap();
    let bf = |v: &[f32]| {
        v.iter()
            .map(|&a| half::bf16::from_f32(a))
            .collect::<Vec<_>>()
    };
    let (b16, w1_16, w2_16) = (bf(&x.base), bf(&x.w1), bf(&x.w2));
    let round = |v: &[half::bf16]| v.iter().map(|a| a.to_f32()).collect::<Vec<_>>();
    let rounded = Inputs {
        base: round(&b16),
        w1: round(&w1_16),
        w2: round(&w2_16),
        anchors: x.anchors.clone(),
        ..x
    };
    for t in [0.0, 0.9] {
        let o = opts(t, Seeds::Scalar(4), &map, None, 1.0);
        let want = run(&rounded, &o).unwrap();
        let got = sample_block_slices(
            Rows3::new(Floats::BF16(&b16), [4, 3, 520]).unwrap(),
            Mat::new(Floats::BF16(&w1_16), [520, 8]).unwrap(),
            Mat::new(Floats::BF16(&w2_16), [520, 8]).unwrap(),
            &rounded.anchors,
            &o,
        )
        .unwrap();
        assert_eq!(got, want);
    }
}

#[test]
fn per_request_seeds_make_results_independent_of_batch_order_and_threads() {
    let x = inputs(6, 3, 300, 300, 4, 8);
    let map = IdMap::identity(300).unwrap();
    let seeds: Vec<u64> = (0..6).map(|i| 1000 + i).collect();
    let out = run(
        &x,
        &opts(1.0, Seeds::PerRequest(seeds.clone()), &map, None, 1.0),
    )
    .unwrap();
    let perm = [4usize, 0, 5, 2, 1, 3];
    let mut y = inputs(6, 3, 300, 300, 4, 8);
    for (new, &old) in perm.iter().enumerate() {
        y.base[new * 900..(new + 1) * 900].copy_from_slice(&x.base[old * 900..(old + 1) * 900]);
        y.anchors[new] = x.anchors[old];
    }
    let pseeds: Vec<u64> = perm.iter().map(|&o| seeds[o]).collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let permuted = pool
        .install(|| run(&y, &opts(1.0, Seeds::PerRequest(pseeds), &map, None, 1.0)))
        .unwrap();
    for (new, &old) in perm.iter().enumerate() {
        assert_eq!(
            permuted.tokens[new * 3..new * 3 + 3],
            out.tokens[old * 3..old * 3 + 3]
        );
        assert_eq!(
            permuted.draft_logits[new * 900..(new + 1) * 900],
            out.draft_logits[old * 900..(old + 1) * 900]
        );
    }
}

#[test]
fn tensor_front_matches_the_slice_core() {
    use candle_core::{Device, Tensor};
    let x = inputs(2, 3, 64, 64, 4, 9);
    let map = IdMap::identity(60).unwrap();
    let o = opts(0.9, Seeds::Scalar(7), &map, None, 1.0);
    let dev = Device::Cpu;
    let got = sample_block(
        &Tensor::from_vec(x.base.clone(), (2, 3, 64), &dev).unwrap(),
        &Tensor::from_vec(x.w1.clone(), (64, 4), &dev).unwrap(),
        // A transposed view: the front makes it contiguous.
        &Tensor::from_vec(x.w2.clone(), (64, 4), &dev)
            .unwrap()
            .t()
            .unwrap()
            .t()
            .unwrap(),
        &Tensor::from_vec(x.anchors.clone(), 2, &dev).unwrap(),
        &o,
    )
    .unwrap();
    assert_eq!(got, run(&x, &o).unwrap());
}

#[test]
fn invalid_inputs_give_typed_errors() {
    let x = inputs(2, 2, 10, 10, 3, 10);
    let id = IdMap::identity(10).unwrap();
    let code = |x: &Inputs, o: &BlockOptions<'_>| run(x, o).unwrap_err().code();
    let ok = |t| opts(t, Seeds::Scalar(0), &id, None, 1.0);
    let mut bad = inputs(2, 2, 10, 10, 3, 10);
    bad.anchors[1] = 10;
    assert_eq!(code(&bad, &ok(1.0)), "token-out-of-range");
    assert_eq!(
        code(&x, &opts(-1.0, Seeds::Scalar(0), &id, None, 1.0)),
        "invalid-argument"
    );
    assert_eq!(
        code(&x, &opts(f32::NAN, Seeds::Scalar(0), &id, None, 1.0)),
        "invalid-argument"
    );
    assert_eq!(
        code(&x, &opts(1.0, Seeds::Scalar(0), &id, None, 0.0)),
        "invalid-argument"
    );
    assert_eq!(
        code(&x, &opts(1.0, Seeds::Scalar(0), &id, Some(0), 1.0)),
        "invalid-argument"
    );
    assert_eq!(
        code(&x, &opts(1.0, Seeds::PerRequest(vec![1]), &id, None, 1.0)),
        "bad-shape"
    );
    // Identity map over a larger target vocabulary: a reduced drafter without d2t.
    let wide = IdMap::identity(12).unwrap();
    let e = run(&x, &opts(1.0, Seeds::Scalar(0), &wide, None, 1.0)).unwrap_err();
    assert!(e.to_string().contains("id_map"), "{e}");
    // d2t table of the wrong length.
    let table = IdMap::from_offsets(&[0, 0, 0], 3, 10).unwrap();
    assert_eq!(
        code(&x, &opts(1.0, Seeds::Scalar(0), &table, None, 1.0)),
        "invalid-argument"
    );
    // W1 too small for the ids the drafter can emit.
    let mut small = inputs(2, 2, 10, 6, 3, 10);
    small.anchors = vec![0, 1];
    let e = run(&small, &ok(1.0)).unwrap_err();
    assert!(e.to_string().contains("markov_w1"), "{e}");
    // Shape mismatches.
    let mut y = inputs(2, 2, 10, 10, 3, 10);
    y.w2.truncate(9 * 3);
    let e = sample_block_slices(
        Rows3::new(Floats::F32(&y.base), [2, 2, 10]).unwrap(),
        Mat::new(Floats::F32(&y.w1), [10, 3]).unwrap(),
        Mat::new(Floats::F32(&y.w2), [9, 3]).unwrap(),
        &y.anchors,
        &ok(1.0),
    )
    .unwrap_err();
    assert_eq!(e.code(), "bad-shape");
    assert!(e.to_string().contains("markov_w2"));
    let e = sample_block_slices(
        Rows3::new(Floats::F32(&y.base), [2, 2, 10]).unwrap(),
        Mat::new(Floats::F32(&y.w1[..20]), [10, 2]).unwrap(),
        Mat::new(Floats::F32(&x.w2), [10, 3]).unwrap(),
        &y.anchors,
        &ok(1.0),
    )
    .unwrap_err();
    assert!(e.to_string().contains("rank"), "{e}");
    assert_eq!(
        Rows3::new(Floats::F32(&y.base), [2, 2, 11])
            .unwrap_err()
            .code(),
        "bad-shape"
    );
    // Non-finite and fully masked rows.
    let mut nan = inputs(2, 2, 10, 10, 3, 10);
    nan.base[13] = f32::NAN;
    assert_eq!(code(&nan, &ok(1.0)), "non-finite");
    assert_eq!(code(&nan, &ok(0.0)), "non-finite");
    let mut masked = inputs(2, 2, 10, 10, 3, 10);
    masked.base[20..30].fill(f32::NEG_INFINITY);
    assert_eq!(code(&masked, &ok(1.0)), "invalid-argument");
}
