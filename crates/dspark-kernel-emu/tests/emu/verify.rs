//! `kernels/fused_verify.cu`, run by the host emulation, against its Rust model: the same
//! output words, bit for bit, over random calls (dtypes, truncations, greedy and sampled
//! requests, stop ids, draft logits or none, masked and invalid rows, several chunks per row),
//! within the launch plan's budgets.

use dspark::sampling::fused::layout::TokenKind;
use dspark::sampling::fused::testing::{decode, verify_model};
use dspark::sampling::fused::{TokenSource, VerifyInputs, VerifyShape, run_verify, verify_plan};
use dspark::sampling::{PerRequest, Rows3, Seeds, Tokens, VerifyOptions};
use dspark_kernel_emu::Emu;

use crate::common::{Data, Rng};

/// Logits with peaks, exact ties and (optionally) masked values.
fn logits(rng: &mut Rng, rows: usize, v: usize, mask: bool) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * v);
    for _ in 0..rows {
        let mut row: Vec<f32> = (0..v).map(|_| rng.uniform() * 6.0 - 3.0).collect();
        for _ in 0..v.min(4) {
            let i = rng.below(v);
            row[i] += 4.0;
        }
        if v > 3 && rng.below(3) == 0 {
            let (i, j) = (rng.below(v), rng.below(v));
            row[j] = row[i];
        }
        if mask && v > 1 {
            for _ in 0..v / 5 {
                let i = rng.below(v);
                row[i] = f32::NEG_INFINITY;
            }
        }
        out.extend(row);
    }
    out
}

fn options(rng: &mut Rng, b: usize, k: usize, v: usize, seed: u64) -> VerifyOptions {
    let (mut temps, mut top_ks, mut top_ps) = (vec![], vec![], vec![]);
    for _ in 0..b {
        let kind = rng.below(6);
        temps.push(match kind {
            0 => 0.0,
            1 => 1e-38,
            _ => 0.5 + rng.uniform(),
        });
        top_ks.push((kind == 3 || kind == 5).then(|| 1 + rng.below(40.min(v + 2))));
        top_ps.push(if kind == 4 || kind == 5 {
            0.3 + 0.6 * rng.uniform()
        } else {
            1.0
        });
    }
    VerifyOptions {
        temperature: PerRequest::Each(temps),
        top_k: PerRequest::Each(top_ks),
        top_p: PerRequest::Each(top_ps),
        seeds: Seeds::Scalar(seed),
        num_draft: (rng.below(2) == 0).then(|| (0..b).map(|_| rng.below(k + 1)).collect()),
        stop_token_ids: if rng.below(3) == 0 {
            vec![rng.below(v) as u32, rng.below(v) as u32]
        } else {
            Vec::new()
        },
    }
}

struct Case {
    dims: [usize; 3],
    target: Data,
    draft: Option<Data>,
    tokens: Vec<i64>,
    opts: VerifyOptions,
}

fn case(rng: &mut Rng, v: usize, seed: u64) -> Case {
    let big = v > 2000;
    let b = 1 + rng.below(if big { 2 } else { 4 });
    let k = rng.below(if big { 3 } else { 5 });
    let w = k + 1;
    let mask = rng.below(3) == 0;
    let t = logits(rng, b * w, v, mask);
    let mut tokens = Vec::with_capacity(b * k);
    for r in 0..b {
        for i in 0..k {
            let row = &t[(r * w + i) * v..(r * w + i + 1) * v];
            let best = (0..v).fold(0, |m, j| if row[j] > row[m] { j } else { m });
            tokens.push(if rng.below(3) == 0 {
                rng.below(v)
            } else {
                best
            } as i64);
        }
    }
    let draft = if rng.below(2) == 0 {
        let dtype = rng.below(3);
        Some(Data::new(logits(rng, b * k, v, false), dtype))
    } else {
        None
    };
    let opts = options(rng, b, k, v, seed);
    let dtype = rng.below(3);
    Case {
        dims: [b, w, v],
        target: Data::new(t, dtype),
        draft,
        tokens,
        opts,
    }
}

/// The emulator's words of a call and the emulator (its launch log).
type Emulated = Option<(Vec<i64>, Emu)>;

/// Model words and emulated words of one call (the emulator reading the ids where they are,
/// or uploading them when `upload`).
fn both(c: &Case, upload: bool) -> (dspark::Result<Vec<i64>>, Emulated) {
    let [b, w, v] = c.dims;
    let target = Rows3::new(c.target.floats(), c.dims).unwrap();
    let draft = c
        .draft
        .as_ref()
        .map(|d| Rows3::new(d.floats(), [b, w - 1, v]).unwrap());
    let tokens = Tokens::new(&c.tokens, [b, w - 1]).unwrap();
    let model = match verify_model(target, tokens, draft, &c.opts) {
        Ok(m) => m,
        Err(e) => return (Err(e), None),
    };
    let inputs = VerifyInputs {
        target: c.target.device(),
        draft: c.draft.as_ref().map(Data::device),
        tokens: if upload {
            TokenSource::Host(&c.tokens)
        } else {
            TokenSource::Device {
                addr: c.tokens.as_ptr() as u64,
                kind: TokenKind::I64,
            }
        },
    };
    let mut emu = Emu::default();
    let words = run_verify(&mut emu, c.dims, &inputs, &model.reqs, &model.stops).unwrap();
    (Ok(model.words), Some((words, emu)))
}

fn check(c: &Case, what: &str, upload: bool) {
    let [b, w, v] = c.dims;
    let (model, emu) = both(c, upload);
    let Ok(model) = model else {
        return; // a settings error: no launch (the fronts' validation is tested elsewhere)
    };
    let (words, emu) = emu.unwrap();
    assert_eq!(words, model, "{what}: emulated kernels vs model");
    let plan = verify_plan(VerifyShape {
        batch: b,
        width: w,
        vocab: v,
        has_draft: c.draft.is_some(),
        host_tokens: upload,
        stops: c.opts.stop_token_ids.len(),
    });
    let names: Vec<&str> = plan.launches.iter().map(|l| l.kernel).collect();
    assert_eq!(emu.launched, names, "{what}");
    assert_eq!(
        (emu.uploads, emu.downloads),
        (plan.uploads, plan.downloads),
        "{what}"
    );
    // The words decode as the model's do.
    let a = decode(&words, b, w, v).map_err(|e| e.to_string());
    let m = decode(&model, b, w, v).map_err(|e| e.to_string());
    assert_eq!(a, m, "{what}");
}

#[test]
fn emulated_kernels_equal_the_model_on_small_vocabularies() {
    let mut rng = Rng(1);
    for i in 0..60u64 {
        let v = [1usize, 7, 300, 1000][i as usize % 4];
        let c = case(&mut rng, v, i);
        check(&c, &format!("case {i} V {v}"), i % 5 == 0);
    }
}

#[test]
fn emulated_kernels_equal_the_model_over_several_chunks() {
    let mut rng = Rng(2);
    for i in 0..6u64 {
        let v = [9000usize, 17_000][i as usize % 2];
        let c = case(&mut rng, v, 100 + i);
        check(&c, &format!("case {i} V {v}"), false);
    }
}

#[test]
fn emulated_kernels_report_the_models_errors() {
    let mut rng = Rng(3);
    let (b, k, v) = (2usize, 3usize, 50usize);
    let t = logits(&mut rng, b * (k + 1), v, false);
    let q = logits(&mut rng, b * k, v, false);
    let row = |r: usize, i: usize| (r * (k + 1) + i) * v;
    let drow = |r: usize, i: usize| (r * k + i) * v;
    type Edit = (usize, usize, f32);
    let edits: Vec<(Vec<Edit>, Vec<Edit>)> = vec![
        (vec![(row(1, 3), v, f32::NEG_INFINITY)], vec![]),
        (vec![(row(0, 2) + 5, 1, f32::NAN)], vec![]),
        (vec![(row(0, 0) + 7, 1, f32::INFINITY)], vec![]),
        (vec![], vec![(drow(1, 2) + 49, 1, f32::INFINITY)]),
        (vec![], vec![(drow(0, 0), v, f32::NEG_INFINITY)]),
    ];
    for (ci, (te, de)) in edits.into_iter().enumerate() {
        let (mut tt, mut dd) = (t.clone(), q.clone());
        for (at, n, x) in te {
            tt[at..at + n].fill(x);
        }
        for (at, n, x) in de {
            dd[at..at + n].fill(x);
        }
        for temp in [0.0f32, 1.0] {
            let mut tokens: Vec<i64> = (0..b * k).map(|i| (i * 7 % v) as i64).collect();
            if ci == 0 {
                tokens[k + 1] = 60; // out of range: reported before any row error
            }
            let c = Case {
                dims: [b, k + 1, v],
                target: Data::new(tt.clone(), 0),
                draft: Some(Data::new(dd.clone(), 2)),
                tokens,
                opts: VerifyOptions {
                    temperature: PerRequest::All(temp),
                    seeds: Seeds::Scalar(ci as u64),
                    ..VerifyOptions::default()
                },
            };
            // The host checks refuse an out-of-range id before launching: run the kernels on
            // the device copy of the ids instead, so that the kernels' own check is compared.
            check(&c, &format!("edit {ci} T {temp}"), false);
        }
    }
}
