//! Verification semantics: greedy acceptance, stop tokens, partial verification, masked vocab,
//! dtypes, order independence, the tensor front and typed errors.

use crate::sampling_common::{TestRng, assert_follows, histogram, reference_probs};
use dspark::sampling::{
    Floats, PerRequest, Rows3, Seeds, Tokens, Verification, VerifyOptions, verify, verify_slices,
};

fn run(
    target: &[f32],
    dims: [usize; 3],
    drafts: &[i64],
    q: Option<&[f32]>,
    o: &VerifyOptions,
) -> dspark::Result<Verification> {
    let [b, k1, v] = dims;
    verify_slices(
        Rows3::new(Floats::F32(target), dims).unwrap(),
        Tokens {
            data: drafts,
            dims: [b, k1 - 1],
        },
        q.map(|q| Rows3::new(Floats::F32(q), [b, k1 - 1, v]).unwrap()),
        o,
    )
}

fn greedy() -> VerifyOptions {
    VerifyOptions {
        temperature: PerRequest::All(0.0),
        ..VerifyOptions::default()
    }
}

/// Rows whose argmax is `ids[i]` (value 5 there, small noise elsewhere).
fn peaked(ids: &[usize], v: usize, rng: &mut TestRng) -> Vec<f32> {
    let mut out = Vec::new();
    for &id in ids {
        let mut row = rng.normals(v, 0.5);
        row[id] = 5.0;
        out.extend(row);
    }
    out
}

#[test]
fn greedy_accepts_while_drafts_match_the_argmax() {
    let mut rng = TestRng(1);
    let target = peaked(&[3, 1, 4, 1], 6, &mut rng);
    let dims = [1, 4, 6];
    let v = run(&target, dims, &[3, 1, 2], None, &greedy()).unwrap();
    assert_eq!(v.tokens, vec![3, 1, 4, -1]);
    assert_eq!(v.num_accepted, vec![2]);
    let v = run(&target, dims, &[3, 1, 4], None, &greedy()).unwrap();
    assert_eq!(v.tokens, vec![3, 1, 4, 1]);
    assert_eq!(v.num_accepted, vec![3]);
    let v = run(&target, dims, &[0, 1, 4], None, &greedy()).unwrap();
    assert_eq!(v.tokens, vec![3, -1, -1, -1]);
    assert_eq!(v.emitted(0), &[3]);
    // Ties go to the lowest id.
    let mut tied = target.clone();
    tied[5] = 5.0;
    let v = run(&tied, dims, &[5, 1, 4], None, &greedy()).unwrap();
    assert_eq!(v.tokens[0], 3);
}

#[test]
fn vanishing_temperatures_behave_as_greedy() {
    let mut rng = TestRng(10);
    let target = rng.normals(3 * 4 * 40, 1.0);
    let drafts: Vec<i64> = (0..9).map(|i| (i * 7 % 40) as i64).collect();
    let want = run(&target, [3, 4, 40], &drafts, None, &greedy()).unwrap();
    // Below `GREEDY_BELOW` (1e-5) every temperature is the argmax: 1e-38 included, whose
    // 1/T is finite but would scale logits past f32's range.
    for t in [1e-45f32, 1e-38, 1e-20, 9.9e-6] {
        let tiny = VerifyOptions {
            temperature: PerRequest::All(t),
            ..VerifyOptions::default()
        };
        assert_eq!(
            run(&target, [3, 4, 40], &drafts, None, &tiny).unwrap(),
            want,
            "T {t}"
        );
    }
}

#[test]
fn accepted_stop_token_ends_the_round_without_bonus() {
    let mut rng = TestRng(2);
    let target = peaked(&[3, 1, 4, 1], 6, &mut rng);
    let o = VerifyOptions {
        stop_token_ids: vec![1, 9],
        ..greedy()
    };
    let v = run(&target, [1, 4, 6], &[3, 1, 4], None, &o).unwrap();
    assert_eq!(v.tokens, vec![3, 1, -1, -1]);
    assert_eq!(v.num_accepted, vec![2]);
    // Sampled: a token with p ~ 1 is accepted and stops too.
    let sampled = VerifyOptions {
        stop_token_ids: vec![3],
        ..VerifyOptions::default()
    };
    let mut sharp = target.clone();
    sharp[3] = 60.0;
    let v = run(&sharp, [1, 4, 6], &[3, 1, 4], None, &sampled).unwrap();
    assert_eq!(v.tokens, vec![3, -1, -1, -1]);
}

#[test]
fn num_draft_verifies_a_prefix_and_takes_the_bonus_from_row_n() {
    let mut rng = TestRng(3);
    let target = peaked(&[3, 1, 4, 1, 0, 2, 2, 5], 6, &mut rng);
    let o = VerifyOptions {
        num_draft: Some(vec![1, 0]),
        ..greedy()
    };
    // Drafts past num_draft are ignored, even invalid ones.
    let v = run(&target, [2, 4, 6], &[3, 0, -1, 77, -5, 0], None, &o).unwrap();
    assert_eq!(v.tokens, vec![3, 1, -1, -1, 0, -1, -1, -1]);
    assert_eq!(v.num_accepted, vec![1, 0]);
}

#[test]
fn masked_target_tokens_are_never_emitted() {
    let n = 20_000;
    let mut rng = TestRng(4);
    let mut row = rng.normals(8, 1.0);
    row[2] = f32::NEG_INFINITY;
    row[6] = f32::NEG_INFINITY;
    let target: Vec<f32> = row.iter().cycle().take(n * 2 * 8).cloned().collect();
    // Every draft is the masked token 2: always rejected, the correction follows p minus nothing.
    let drafts = vec![2i64; n];
    let v = run(&target, [n, 2, 8], &drafts, None, &VerifyOptions::default()).unwrap();
    assert!(v.num_accepted.iter().all(|&a| a == 0));
    let counts = histogram((0..n).map(|i| v.tokens[i * 2] as usize), 8);
    assert_follows(
        &counts,
        &reference_probs(&row, 1.0, None, 1.0),
        "correction",
    );
}

#[test]
fn acceptance_rate_is_the_overlap_of_p_and_q() {
    // x ~ q is accepted with probability sum_x min(p(x), q(x)).
    let n = 50_000;
    let mut rng = TestRng(5);
    let (pl, ql) = (rng.normals(6, 1.0), rng.normals(6, 1.0));
    let (p, q) = (
        reference_probs(&pl, 1.0, None, 1.0),
        reference_probs(&ql, 1.0, None, 1.0),
    );
    let overlap: f64 = p.iter().zip(&q).map(|(a, b)| a.min(*b)).sum();
    let mut drafts = Vec::with_capacity(n);
    for _ in 0..n {
        let u = rng.uniform();
        let mut acc = 0.0;
        let x = (0..6).find(|&i| {
            acc += q[i];
            acc > u
        });
        drafts.push(x.unwrap_or(5) as i64);
    }
    let target: Vec<f32> = pl.iter().cycle().take(n * 2 * 6).cloned().collect();
    let qrows: Vec<f32> = ql.iter().cycle().take(n * 6).cloned().collect();
    let v = run(
        &target,
        [n, 2, 6],
        &drafts,
        Some(&qrows),
        &VerifyOptions::default(),
    )
    .unwrap();
    let accepted = v.num_accepted.iter().filter(|&&a| a == 1).count() as u64;
    assert_follows(
        &[accepted, n as u64 - accepted],
        &[overlap, 1.0 - overlap],
        "accept rate",
    );
    // The first emitted token follows p.
    let counts = histogram((0..n).map(|i| v.tokens[i * 2] as usize), 6);
    assert_follows(&counts, &p, "first token");
}

#[test]
fn half_precision_targets_match_f32_on_the_rounded_values() {
    let mut rng = TestRng(6);
    let (b, k, v) = (5, 3, 600);
    let target = rng.normals(b * (k + 1) * v, 2.0);
    let bf: Vec<half::bf16> = target.iter().map(|&x| half::bf16::from_f32(x)).collect();
    let f16: Vec<half::f16> = target.iter().map(|&x| half::f16::from_f32(x)).collect();
    let drafts: Vec<i64> = (0..b * k).map(|i| (i * 37 % v) as i64).collect();
    let o = VerifyOptions {
        top_k: PerRequest::All(Some(50)),
        top_p: PerRequest::All(0.9),
        seeds: Seeds::Scalar(3),
        ..VerifyOptions::default()
    };
    let rbf: Vec<f32> = bf.iter().map(|x| x.to_f32()).collect();
    let r16: Vec<f32> = f16.iter().map(|x| x.to_f32()).collect();
    let dims = [b, k + 1, v];
    for (held, widened) in [(Floats::BF16(&bf), &rbf), (Floats::F16(&f16), &r16)] {
        let tokens = Tokens::new(&drafts, [dims[0], dims[1] - 1]).unwrap();
        let got = verify_slices(Rows3::new(held, dims).unwrap(), tokens, None, &o);
        assert_eq!(got.unwrap(), run(widened, dims, &drafts, None, &o).unwrap());
    }
}

/// From `TestRng(seed)`: target rows `[b, k + 1, v]` and draft rows `[b, k, v]` (std 1), and
/// drafts `i · stride mod v`.
fn rows_and_drafts(
    seed: u64,
    [b, k, v]: [usize; 3],
    stride: usize,
) -> (Vec<f32>, Vec<f32>, Vec<i64>) {
    let mut rng = TestRng(seed);
    let target = rng.normals(b * (k + 1) * v, 1.0);
    let q = rng.normals(b * k * v, 1.0);
    let drafts = (0..b * k).map(|i| (i * stride % v) as i64).collect();
    (target, q, drafts)
}

#[test]
fn per_request_seeds_make_results_independent_of_batch_order_and_threads() {
    let (b, k, v) = (8, 3, 300);
    let (target, q, drafts) = rows_and_drafts(7, [b, k, v], 53);
    let seeds: Vec<u64> = (0..b as u64).map(|i| 77 + i * 3).collect();
    let temps: Vec<f32> = (0..b).map(|i| [0.0, 0.5, 1.0, 1.5][i % 4]).collect();
    let o = |seeds: Vec<u64>, temps: Vec<f32>| VerifyOptions {
        temperature: PerRequest::Each(temps),
        seeds: Seeds::PerRequest(seeds),
        ..VerifyOptions::default()
    };
    let out = run(
        &target,
        [b, k + 1, v],
        &drafts,
        Some(&q),
        &o(seeds.clone(), temps.clone()),
    )
    .unwrap();
    let perm = [3usize, 7, 0, 5, 1, 6, 2, 4];
    let (tw, qw) = ((k + 1) * v, k * v);
    let (mut pt, mut pq, mut pd) = (Vec::new(), Vec::new(), Vec::new());
    for &o in &perm {
        pt.extend_from_slice(&target[o * tw..(o + 1) * tw]);
        pq.extend_from_slice(&q[o * qw..(o + 1) * qw]);
        pd.extend_from_slice(&drafts[o * k..(o + 1) * k]);
    }
    let ps: Vec<u64> = perm.iter().map(|&o| seeds[o]).collect();
    let ptemps: Vec<f32> = perm.iter().map(|&o| temps[o]).collect();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let permuted = pool
        .install(|| run(&pt, [b, k + 1, v], &pd, Some(&pq), &o(ps, ptemps)))
        .unwrap();
    for (new, &old) in perm.iter().enumerate() {
        assert_eq!(permuted.emitted(new), out.emitted(old));
        assert_eq!(permuted.num_accepted[new], out.num_accepted[old]);
    }
}

#[test]
fn tensor_front_matches_the_slice_core() {
    use candle_core::{DType, Device, Tensor};
    let (b, k, v) = (3, 2, 50);
    let (target, q, drafts) = rows_and_drafts(8, [b, k, v], 11);
    let o = VerifyOptions::default();
    let dev = Device::Cpu;
    let tt = Tensor::from_vec(target.clone(), (b, k + 1, v), &dev).unwrap();
    let dt = Tensor::from_vec(drafts.clone(), (b, k), &dev).unwrap();
    let qt = Tensor::from_vec(q.clone(), (b, k, v), &dev).unwrap();
    let want = run(&target, [b, k + 1, v], &drafts, Some(&q), &o).unwrap();
    let u32_drafts = dt.to_dtype(DType::U32).unwrap();
    assert_eq!(verify(&tt, &u32_drafts, Some(&qt), &o).unwrap(), want);
    let e = verify(&tt, &tt, None, &o).unwrap_err();
    assert_eq!(e.code(), "unsupported-dtype");
    let e = verify(&tt.flatten_all().unwrap(), &dt, None, &o).unwrap_err();
    assert_eq!(e.code(), "bad-shape");
}

#[test]
fn invalid_inputs_give_typed_errors() {
    let mut rng = TestRng(9);
    let (b, k, v) = (2, 2, 5);
    let dims = [b, k + 1, v];
    let target = rng.normals(b * (k + 1) * v, 1.0);
    let drafts = vec![0i64, 1, 2, 3];
    let d = VerifyOptions::default;
    let code = |t: &[f32], dr: &[i64], q: Option<&[f32]>, o: &VerifyOptions| {
        run(t, dims, dr, q, o).unwrap_err().code()
    };
    // Non-finite target values, also in rows the round never reaches.
    for (pos, val) in [(3, f32::NAN), (27, f32::NAN), (14, f32::INFINITY)] {
        let mut t = target.clone();
        t[pos] = val;
        assert_eq!(code(&t, &drafts, None, &d()), "non-finite", "pos {pos}");
        assert_eq!(
            code(&t, &drafts, None, &greedy()),
            "non-finite",
            "pos {pos}"
        );
    }
    let mut masked = target.clone();
    masked[5..10].fill(f32::NEG_INFINITY);
    assert_eq!(code(&masked, &drafts, None, &d()), "invalid-argument");
    let mut q = rng.normals(b * k * v, 1.0);
    q[7] = f32::NAN;
    assert_eq!(code(&target, &drafts, Some(&q), &d()), "non-finite");
    // Token ids.
    assert_eq!(
        code(&target, &[0, 5, 1, 1], None, &d()),
        "token-out-of-range"
    );
    assert_eq!(
        code(&target, &[0, 1, -1, 1], None, &d()),
        "token-out-of-range"
    );
    // Shapes.
    assert_eq!(code(&target, &[0, 1, 2], None, &d()), "bad-shape");
    let e = verify_slices(
        Rows3::new(Floats::F32(&target), dims).unwrap(),
        Tokens::new(&drafts, [dims[0], dims[1] - 1]).unwrap(),
        Some(Rows3::new(Floats::F32(&target[..20]), [2, 2, 5]).unwrap()).map(|mut r| {
            r.dims = [2, 1, 10];
            r
        }),
        &d(),
    )
    .unwrap_err();
    assert_eq!(e.code(), "bad-shape");
    let short = Rows3 {
        data: Floats::F32(&target[..10]),
        dims,
    };
    assert_eq!(
        verify_slices(
            short,
            Tokens::new(&drafts, [dims[0], dims[1] - 1]).unwrap(),
            None,
            &d()
        )
        .unwrap_err()
        .code(),
        "bad-shape"
    );
    // Options.
    let with = |f: &dyn Fn(&mut VerifyOptions)| {
        let mut o = d();
        f(&mut o);
        code(&target, &drafts, None, &o)
    };
    assert_eq!(
        with(&|o| o.top_p = PerRequest::All(0.0)),
        "invalid-argument"
    );
    assert_eq!(
        with(&|o| o.top_p = PerRequest::All(1.5)),
        "invalid-argument"
    );
    assert_eq!(
        with(&|o| o.top_p = PerRequest::All(f32::NAN)),
        "invalid-argument"
    );
    assert_eq!(
        with(&|o| o.temperature = PerRequest::Each(vec![1.0, -0.1])),
        "invalid-argument"
    );
    assert_eq!(
        with(&|o| o.temperature = PerRequest::All(f32::INFINITY)),
        "invalid-argument"
    );
    assert_eq!(
        with(&|o| o.top_k = PerRequest::All(Some(0))),
        "invalid-argument"
    );
    assert_eq!(
        with(&|o| o.top_k = PerRequest::Each(vec![None])),
        "bad-shape"
    );
    assert_eq!(
        with(&|o| o.num_draft = Some(vec![3, 0])),
        "invalid-argument"
    );
    assert_eq!(with(&|o| o.num_draft = Some(vec![1])), "bad-shape");
    assert_eq!(
        with(&|o| o.seeds = Seeds::PerRequest(vec![1, 2, 3])),
        "bad-shape"
    );
    let e = run(&target, dims, &[0, 9, 1, 1], None, &d()).unwrap_err();
    assert!(e.to_string().contains("draft_tokens"), "{e}");
}
