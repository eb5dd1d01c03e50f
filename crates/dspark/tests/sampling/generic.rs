//! The device-generic tensor kernels (run here on the CPU) and the fused kernels' models against
//! the fast slice kernels, in one process: greedy results identical, sampled ones identical for
//! the same seeds in at least 99% of draws (float summation order may move a boundary), errors
//! identical. Also a timing (`--ignored`) of the paths at `B = 8, K = 7, V = 151936`.

use crate::sampling_common::TestRng;
use crate::sampling_common::held::Held;
use candle_core::Device;
use dspark::idmap::IdMap;
use dspark::sampling::{
    BlockOptions, DraftBlock, Floats, Mat, PerRequest, Rows3, Seeds, Tokens, Verification,
    VerifyOptions, sample_block_slices_fused, sample_block_slices_on, verify_slices_fused,
    verify_slices_on,
};

fn pick(rng: &mut TestRng, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// The path compared with the fast one.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Other {
    /// The device-generic tensor kernels on the CPU.
    Tensor,
    /// The fused kernels' models.
    Fused,
}

/// The fast path and `other` on the same inputs.
fn verify_pair(
    other: Other,
    target: &Held,
    dims: [usize; 3],
    drafts: &[i64],
    draft: Option<&Held>,
    o: &VerifyOptions,
) -> (dspark::Result<Verification>, dspark::Result<Verification>) {
    let [b, w, v] = dims;
    let t = Rows3::new(target.floats(), dims).unwrap();
    let toks = Tokens::new(drafts, [b, w - 1]).unwrap();
    let d = draft.map(|d| Rows3::new(d.floats(), [b, w - 1, v]).unwrap());
    let fast = verify_slices_on(None, t, toks, d, o);
    let theirs = match other {
        Other::Tensor => verify_slices_on(Some(&Device::Cpu), t, toks, d, o),
        Other::Fused => verify_slices_fused(t, toks, d, o),
    };
    (fast, theirs)
}

/// Logits with structure: a few peaked tokens, exact ties, masked columns and masked rows.
fn logits(rng: &mut TestRng, rows: usize, v: usize, mask: bool) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * v);
    for _ in 0..rows {
        let mut row = rng.normals(v, 1.5);
        for _ in 0..v.min(4) {
            let i = pick(rng, v);
            row[i] += 4.0;
        }
        if v > 3 && pick(rng, 4) == 0 {
            let (i, j) = (pick(rng, v), pick(rng, v));
            row[j] = row[i];
        }
        if mask && v > 1 {
            for _ in 0..v / 5 {
                let i = pick(rng, v);
                row[i] = f32::NEG_INFINITY;
            }
        }
        out.extend(row);
    }
    out
}

/// Random verification options for `b` requests over a vocabulary of `v`.
fn options(rng: &mut TestRng, b: usize, k: usize, v: usize, seed: u64) -> VerifyOptions {
    let mut temps = Vec::new();
    let mut top_ks = Vec::new();
    let mut top_ps = Vec::new();
    for _ in 0..b {
        let kind = pick(rng, 6);
        temps.push(match kind {
            0 => 0.0,
            1 => 1e-39,
            _ => 0.5 + rng.uniform() as f32,
        });
        top_ks.push(if kind == 3 || kind == 5 {
            Some(1 + pick(rng, 40.min(v + 2)))
        } else {
            None
        });
        top_ps.push(if kind == 4 || kind == 5 {
            0.3 + 0.6 * rng.uniform() as f32
        } else {
            1.0
        });
    }
    let num_draft = (pick(rng, 2) == 0).then(|| (0..b).map(|_| pick(rng, k + 1)).collect());
    let stop_token_ids = if pick(rng, 3) == 0 {
        vec![pick(rng, v) as u32, pick(rng, v) as u32]
    } else {
        Vec::new()
    };
    VerifyOptions {
        temperature: PerRequest::Each(temps),
        top_k: PerRequest::Each(top_ks),
        top_p: PerRequest::Each(top_ps),
        seeds: if pick(rng, 2) == 0 {
            Seeds::Scalar(seed)
        } else {
            Seeds::PerRequest((0..b as u64).map(|r| seed ^ (r * 7919)).collect())
        },
        num_draft,
        stop_token_ids,
    }
}

/// Drafts that often equal the target argmax (so rounds reach later positions).
fn drafts_for(rng: &mut TestRng, target: &[f32], b: usize, k: usize, v: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(b * k);
    for r in 0..b {
        for i in 0..k {
            let row = &target[(r * (k + 1) + i) * v..(r * (k + 1) + i + 1) * v];
            let best = (0..v).fold(0, |m, j| if row[j] > row[m] { j } else { m });
            out.push(if pick(rng, 3) == 0 {
                pick(rng, v)
            } else {
                best
            } as i64);
        }
    }
    out
}

/// Counts of compared sampled and greedy draws.
#[derive(Default, Debug)]
struct Tally {
    sampled: usize,
    sampled_same: usize,
    greedy: usize,
}

fn compare_verify(
    fast: &Verification,
    tensor: &Verification,
    o: &VerifyOptions,
    tally: &mut Tally,
    what: &str,
) {
    let temps = match &o.temperature {
        PerRequest::Each(t) => t.clone(),
        PerRequest::All(t) => vec![*t; fast.batch],
    };
    for (r, &temp) in temps.iter().enumerate() {
        let same =
            fast.emitted(r) == tensor.emitted(r) && fast.num_accepted[r] == tensor.num_accepted[r];
        if !(1.0 / temp).is_finite() {
            tally.greedy += 1;
            assert!(same, "{what}: greedy request {r}: {fast:?} vs {tensor:?}");
        } else {
            tally.sampled += 1;
            tally.sampled_same += usize::from(same);
        }
    }
}

fn run_cases(vocabs: &[usize], cases: usize, seed: u64) -> Tally {
    run_cases_on(Other::Tensor, vocabs, cases, seed)
}

fn run_cases_on(other: Other, vocabs: &[usize], cases: usize, seed: u64) -> Tally {
    let mut rng = TestRng(seed);
    let mut tally = Tally::default();
    for case in 0..cases {
        let v = vocabs[case % vocabs.len()];
        let big = v > 1000;
        let b = 1 + pick(&mut rng, if big { 3 } else { 8 });
        let k = pick(&mut rng, if big { 3 } else { 8 });
        let w = k + 1;
        let mask = pick(&mut rng, 3) == 0;
        let t = logits(&mut rng, b * w, v, mask);
        let drafts = drafts_for(&mut rng, &t, b, k, v);
        let q = (pick(&mut rng, 2) == 0).then(|| logits(&mut rng, b * k, v, false));
        let dtype = pick(&mut rng, 3);
        let target = Held::new(t, dtype);
        let draft = q.map(|q| Held::new(q, pick(&mut rng, 3)));
        let mut o = options(&mut rng, b, k, v, case as u64);
        if big && other == Other::Tensor {
            // The bisection-heavy truncations are exercised on the smaller vocabularies.
            o.top_k = PerRequest::All(None);
            o.top_p = PerRequest::All(1.0);
        }
        let (fast, tensor) = verify_pair(other, &target, [b, w, v], &drafts, draft.as_ref(), &o);
        let what = format!("case {case} (B {b} K {k} V {v} dtype {dtype}, {other:?})");
        match (fast, tensor) {
            (Ok(f), Ok(t)) => compare_verify(&f, &t, &o, &mut tally, &what),
            (Err(f), Err(t)) => assert_eq!(f.to_string(), t.to_string(), "{what}"),
            (f, t) => panic!("{what}: fast {f:?} vs tensor {t:?}"),
        }
    }
    tally
}

/// Small-vocabulary cases: enough greedy and sampled rows, and at least 99% of the sampled
/// ones the same as on the fast path.
fn assert_small_vocab_tally(tally: &Tally) {
    eprintln!("{tally:?}");
    assert!(tally.greedy > 50 && tally.sampled > 300, "{tally:?}");
    let rate = tally.sampled_same as f64 / tally.sampled as f64;
    assert!(rate >= 0.99, "{tally:?}");
}

#[test]
fn verify_matches_the_fast_path_on_small_vocabularies() {
    assert_small_vocab_tally(&run_cases(&[1, 7, 300], 240, 11));
}

#[test]
fn verify_matches_the_fast_path_above_8192_columns() {
    let tally = run_cases(&[10_000, 40_000], 10, 12);
    eprintln!("{tally:?}");
    assert!(tally.sampled_same + 1 >= tally.sampled, "{tally:?}");
}

#[test]
fn fused_verify_matches_the_fast_path_on_small_vocabularies() {
    assert_small_vocab_tally(&run_cases_on(Other::Fused, &[1, 7, 300], 240, 21));
}

#[test]
fn fused_verify_matches_the_fast_path_above_8192_columns() {
    // Several chunks per row, truncations included.
    let tally = run_cases_on(Other::Fused, &[10_000, 20_000], 10, 22);
    eprintln!("{tally:?}");
    assert!(tally.sampled_same + 1 >= tally.sampled, "{tally:?}");
}

#[test]
fn truncation_matches_on_a_wide_vocabulary() {
    // Top-k and top-p rows past 8192 columns (bisection over a long row).
    let (b, k, v) = (2usize, 2usize, 10_000usize);
    let mut rng = TestRng(13);
    let mut same = 0;
    for case in 0..4u64 {
        let t = logits(&mut rng, b * (k + 1), v, case % 2 == 0);
        let drafts = drafts_for(&mut rng, &t, b, k, v);
        let o = VerifyOptions {
            temperature: PerRequest::All(0.8),
            top_k: PerRequest::Each(vec![Some(20), None]),
            top_p: PerRequest::Each(vec![0.9, 0.7]),
            seeds: Seeds::Scalar(case),
            ..VerifyOptions::default()
        };
        let target = Held::new(t, 0);
        for other in [Other::Tensor, Other::Fused] {
            let (f, t) = verify_pair(other, &target, [b, k + 1, v], &drafts, None, &o);
            let (f, t) = (f.unwrap(), t.unwrap());
            same += (0..b)
                .filter(|&r| f.emitted(r) == t.emitted(r) && f.num_accepted[r] == t.num_accepted[r])
                .count();
        }
    }
    assert!(same >= 15, "{same} of 16 draws identical");
}

#[test]
fn errors_match_the_fast_path() {
    let (b, k, v) = (2usize, 3usize, 50usize);
    let mut rng = TestRng(14);
    let t = logits(&mut rng, b * (k + 1), v, false);
    let q = logits(&mut rng, b * k, v, false);
    let drafts = drafts_for(&mut rng, &t, b, k, v);
    let row = |r: usize, i: usize| (r * (k + 1) + i) * v;
    let drow = |r: usize, i: usize| (r * k + i) * v;
    type Edit = (usize, usize, f32);
    let cases: Vec<(Vec<Edit>, Vec<Edit>)> = vec![
        (vec![(row(1, 3), v, f32::NEG_INFINITY)], vec![]),
        (vec![(row(0, 2) + 5, 1, f32::NAN)], vec![]),
        (vec![(row(0, 0) + 7, 1, f32::INFINITY)], vec![]),
        (vec![], vec![(drow(1, 2) + 49, 1, f32::INFINITY)]),
        (vec![], vec![(drow(0, 0), v, f32::NEG_INFINITY)]),
        (
            vec![(row(1, 1), v, f32::NEG_INFINITY), (row(1, 3), 1, f32::NAN)],
            vec![],
        ),
    ];
    for (ci, (tedits, dedits)) in cases.into_iter().enumerate() {
        let (mut tt, mut dd) = (t.clone(), q.clone());
        for (at, n, val) in tedits {
            tt[at..at + n].fill(val);
        }
        for (at, n, val) in dedits {
            dd[at..at + n].fill(val);
        }
        let (target, draft) = (Held::new(tt, 0), Held::new(dd, 0));
        for temp in [0.0f32, 1.0] {
            for seed in 0..6u64 {
                for with_draft in [false, true] {
                    let o = VerifyOptions {
                        temperature: PerRequest::All(temp),
                        seeds: Seeds::Scalar(seed),
                        ..VerifyOptions::default()
                    };
                    let d = with_draft.then_some(&draft);
                    for other in [Other::Tensor, Other::Fused] {
                        let (f, t) = verify_pair(other, &target, [b, k + 1, v], &drafts, d, &o);
                        let what =
                            format!("case {ci} T {temp} seed {seed} draft {with_draft} {other:?}");
                        match (f, t) {
                            (Ok(f), Ok(t)) if temp == 0.0 => assert_eq!(f, t, "{what}"),
                            (Ok(_), Ok(_)) => {}
                            (Err(f), Err(t)) => {
                                assert_eq!(f.code(), t.code(), "{what}");
                                assert_eq!(f.to_string(), t.to_string(), "{what}");
                            }
                            (f, t) => panic!("{what}: fast {f:?} vs {other:?} {t:?}"),
                        }
                    }
                }
            }
        }
    }
}

/// Inputs of the Markov sampler.
struct Block {
    dims: [usize; 3],
    base: Held,
    w1: Vec<f32>,
    w2: Vec<f32>,
    rank: usize,
    anchors: Vec<u32>,
}

fn block(rng: &mut TestRng, b: usize, k: usize, vd: usize, vin: usize, r: usize) -> Block {
    let dtype = pick(rng, 3);
    Block {
        dims: [b, k, vd],
        base: Held::new(logits(rng, b * k, vd, false), dtype),
        w1: rng.normals(vin * r, 0.3),
        w2: rng.normals(vd * r, 0.3),
        rank: r,
        anchors: (0..b).map(|_| pick(rng, vin) as u32).collect(),
    }
}

fn sample_pair(other: Other, x: &Block, o: &BlockOptions<'_>) -> (DraftBlock, DraftBlock) {
    let vin = x.w1.len() / x.rank;
    let base = Rows3::new(x.base.floats(), x.dims).unwrap();
    let w1 = Mat::new(Floats::F32(&x.w1), [vin, x.rank]).unwrap();
    let w2 = Mat::new(Floats::F32(&x.w2), [x.dims[2], x.rank]).unwrap();
    let fast = sample_block_slices_on(None, base, w1, w2, &x.anchors, o).unwrap();
    let theirs = match other {
        Other::Tensor => sample_block_slices_on(Some(&Device::Cpu), base, w1, w2, &x.anchors, o),
        Other::Fused => sample_block_slices_fused(base, w1, w2, &x.anchors, o),
    };
    (fast, theirs.unwrap())
}

/// Per request, the slots up to the first differing token: draft logits agree (same `-inf`
/// pattern, finite values within rounding) and so do the embeddings. Returns (draws, same).
fn compare_block(f: &DraftBlock, t: &DraftBlock, what: &str) -> (usize, usize) {
    let (k_n, vt, r) = (f.slots, f.target_vocab, f.rank);
    let (mut draws, mut same) = (0, 0);
    for b in 0..f.batch {
        for k in 0..k_n {
            let i = b * k_n + k;
            let e = |d: &DraftBlock| d.prev_embeddings[i * r..(i + 1) * r].to_vec();
            assert_eq!(e(f), e(t), "{what}: embeddings b {b} k {k}");
            let (fr, tr) = (
                &f.draft_logits[i * vt..(i + 1) * vt],
                &t.draft_logits[i * vt..(i + 1) * vt],
            );
            for (j, (a, c)) in fr.iter().zip(tr).enumerate() {
                let ok = if a.is_finite() {
                    (a - c).abs() <= 1e-4 * (1.0 + a.abs())
                } else {
                    a == c
                };
                assert!(ok, "{what}: b {b} k {k} column {j}: {a} vs {c}");
            }
            draws += 1;
            if f.tokens[i] != t.tokens[i] {
                break;
            }
            same += 1;
        }
    }
    (draws, same)
}

#[test]
fn markov_matches_the_fast_path() {
    markov_cases(Other::Tensor, 21);
}

#[test]
fn fused_markov_matches_the_fast_path() {
    markov_cases(Other::Fused, 23);
}

fn markov_cases(other: Other, seed: u64) {
    let mut rng = TestRng(seed);
    let (mut draws, mut same) = (0, 0);
    let (mut gdraws, mut gsame) = (0, 0);
    for case in 0..36usize {
        let vd = [7usize, 300, 1000, 10_000][case % 4];
        let (b, k) = (1 + pick(&mut rng, 8), 1 + pick(&mut rng, 7));
        let r = [1usize, 8, 37][case % 3];
        let table = case % 2 == 1 && vd > 7;
        let vt = if table { vd + vd / 3 } else { vd };
        let map = if table {
            let offsets: Vec<i64> = (0..vd as i64).map(|d| d * 4 / 3 - d).collect();
            IdMap::from_offsets(&offsets, vd, vt).unwrap()
        } else {
            IdMap::identity(vt).unwrap()
        };
        let x = block(&mut rng, b, k, vd, vt, r);
        let greedy = case % 3 == 0;
        let o = BlockOptions {
            temperature: if greedy {
                0.0
            } else {
                0.6 + rng.uniform() as f32
            },
            seeds: Seeds::Scalar(case as u64),
            id_map: &map,
            top_k: (case % 5 == 2).then_some(1 + pick(&mut rng, 30)),
            logit_scale: 1.25,
        };
        let (f, t) = sample_pair(other, &x, &o);
        let what = format!("case {case} (B {b} K {k} V_d {vd} r {r} table {table}, {other:?})");
        let (d, s) = compare_block(&f, &t, &what);
        if greedy {
            (gdraws, gsame) = (gdraws + d, gsame + s);
        } else {
            (draws, same) = (draws + d, same + s);
        }
    }
    eprintln!("greedy {gsame}/{gdraws}, sampled {same}/{draws}");
    // Greedy picks differ only on exact-rounding near-ties of the biased logits (none here).
    assert_eq!(gdraws, gsame, "greedy");
    assert!(same as f64 >= 0.99 * draws as f64, "{same} of {draws}");
}

#[test]
fn markov_errors_match_the_fast_path() {
    let mut rng = TestRng(22);
    let map = IdMap::identity(40).unwrap();
    for top_k in [None, Some(5)] {
        for (bad_b, bad_k, val) in [(1, 2, f32::NAN), (0, 0, f32::INFINITY)] {
            let mut x = block(&mut rng, 3, 3, 40, 40, 4);
            let mut base = logits(&mut rng, 9, 40, false);
            base[(bad_b * 3 + bad_k) * 40 + 11] = val;
            x.base = Held::F32(base);
            let o = BlockOptions {
                temperature: 0.7,
                seeds: Seeds::Scalar(3),
                id_map: &map,
                top_k,
                logit_scale: 1.0,
            };
            let base = Rows3::new(x.base.floats(), x.dims).unwrap();
            let w1 = Mat::new(Floats::F32(&x.w1), [40, 4]).unwrap();
            let w2 = Mat::new(Floats::F32(&x.w2), [40, 4]).unwrap();
            let run = |dev: Option<&Device>| {
                sample_block_slices_on(dev, base, w1, w2, &x.anchors, &o)
                    .unwrap_err()
                    .to_string()
            };
            let fused = sample_block_slices_fused(base, w1, w2, &x.anchors, &o)
                .unwrap_err()
                .to_string();
            assert_eq!(run(None), run(Some(&Device::Cpu)));
            assert_eq!(run(None), fused);
        }
    }
}

/// Speed of both paths on the CPU at `B = 8, K = 7, V = 151936` (run with `--ignored`, in
/// release).
#[test]
#[ignore = "timing; run with --release -- --ignored --nocapture"]
fn timing_of_both_paths() {
    let (b, k, v) = (8usize, 7usize, 151_936usize);
    let mut rng = TestRng(31);
    let t = rng.normals(b * (k + 1) * v, 2.0);
    let q = rng.normals(b * k * v, 2.0);
    let drafts: Vec<i64> = (0..b * k).map(|_| pick(&mut rng, v) as i64).collect();
    let (target, draft) = (Held::new(t, 2), Held::new(q, 2));
    for (label, o) in [
        (
            "greedy",
            VerifyOptions {
                temperature: PerRequest::All(0.0),
                ..VerifyOptions::default()
            },
        ),
        ("T=1", VerifyOptions::default()),
        (
            "T=1 top-k 50 top-p 0.9",
            VerifyOptions {
                top_k: PerRequest::All(Some(50)),
                top_p: PerRequest::All(0.9),
                ..VerifyOptions::default()
            },
        ),
    ] {
        for (path, dev) in [("fast", None), ("tensor", Some(Device::Cpu))] {
            let start = std::time::Instant::now();
            let n = 3;
            for _ in 0..n {
                verify_slices_on(
                    dev.as_ref(),
                    Rows3::new(target.floats(), [b, k + 1, v]).unwrap(),
                    Tokens::new(&drafts, [b, k]).unwrap(),
                    Some(Rows3::new(draft.floats(), [b, k, v]).unwrap()),
                    &o,
                )
                .unwrap();
            }
            let ms = start.elapsed().as_secs_f64() * 1e3 / n as f64;
            println!("verify bf16 {label}: {path} {ms:.1} ms");
        }
    }
    let map = IdMap::identity(v).unwrap();
    let x = block(&mut rng, b, k, v, v, 64);
    for temp in [0.0f32, 0.8] {
        let o = BlockOptions {
            temperature: temp,
            seeds: Seeds::Scalar(1),
            id_map: &map,
            top_k: None,
            logit_scale: 1.0,
        };
        for (path, dev) in [("fast", None), ("tensor", Some(Device::Cpu))] {
            let start = std::time::Instant::now();
            let n = 3;
            for _ in 0..n {
                sample_block_slices_on(
                    dev.as_ref(),
                    Rows3::new(x.base.floats(), x.dims).unwrap(),
                    Mat::new(Floats::F32(&x.w1), [v, 64]).unwrap(),
                    Mat::new(Floats::F32(&x.w2), [v, 64]).unwrap(),
                    &x.anchors,
                    &o,
                )
                .unwrap();
            }
            let ms = start.elapsed().as_secs_f64() * 1e3 / n as f64;
            println!("sample_block r=64 T={temp}: {path} {ms:.1} ms");
        }
    }
}
