//! The drafter's two kernel paths side by side: the test runs the same proposals in this
//! process and in a child process of this test binary with `DSPARK_KERNEL_PATH` set to the
//! other path (the variable is read once per process), and compares them. Greedy drafts must
//! be identical; draft logits and confidences agree to float rounding. The bf16 checkpoint
//! agrees to bf16 rounding: on the fast path its products take the activations rounded to
//! bf16 (the packed kernel's bf16 rule), on the tensor path they stay f32, so a near-tie may
//! draft another token there (and the Markov head follows it): its blocks are compared where
//! they agree, and most must.
use crate::child_common::child_json;
use crate::drafter_common::{Tiny, context, load};
use crate::guide::multiples;
use dspark::device::{KernelPath, kernel_path};
use dspark::sampling::Seeds;
use dspark::{Drafter, InBlockPenalty, ProposeOptions};
use serde_json::{Value, json};

/// Marks the child's output lines.
const MARK: &str = "PROPOSALS ";

/// Every proposal of the comparison, as JSON: a few drafter shapes (Markov + confidence with
/// STS, DFlash, the 1+K layout, a bf16 checkpoint), batches of 1 and 3, greedy and sampled,
/// dense and top-k, cached and stateless.
fn proposals() -> Value {
    let shapes = [
        Tiny::default(),
        Tiny {
            rank: 0,
            confidence: false,
            ..Tiny::default()
        },
        Tiny {
            sample_from_anchor: Some(false),
            ..Tiny::default()
        },
        Tiny {
            dtype: "bf16",
            seed: 11,
            ..Tiny::default()
        },
    ];
    let mut out = Vec::new();
    for (i, tiny) in shapes.iter().enumerate() {
        let (_dir, mut d) = load(tiny);
        if i == 0 {
            let k = d.info().num_draft_tokens;
            let temps = (0..k).map(|k| 0.8 + 0.1 * k as f32).collect();
            d.set_sts(Some(dspark::sampling::StsCalibration::new(temps).unwrap()))
                .unwrap();
        }
        for (b, t) in [(1usize, 7usize), (3, 5)] {
            let ctx = context(100 + i as u64, b, t);
            let anchors: Vec<u32> = (0..b as u32).map(|x| 3 + 5 * x).collect();
            for (temperature, top_k) in [(0.0, None), (0.0, Some(4)), (0.9, None), (0.7, Some(6))] {
                let opts = ProposeOptions {
                    logit_bias: None,
                    in_block: None,
                    guides: None,
                    temperature,
                    seeds: Seeds::Scalar(9),
                    top_k,
                };
                let p = d.propose(&ctx, &anchors, &[2], &opts).unwrap();
                // The cached path over the same context gives the same block.
                let states: Vec<_> = (0..b)
                    .map(|j| {
                        let mut s = d.new_state().unwrap();
                        d.extend(&mut s, &ctx.get(j).unwrap(), 2).unwrap();
                        s
                    })
                    .collect();
                let refs: Vec<_> = states.iter().collect();
                let c = d.propose_cached(&refs, &anchors, &opts).unwrap();
                assert_eq!(p.tokens, c.tokens);
                out.push(case(
                    format!("shape {i}, B {b}, T {temperature}, top-k {top_k:?}"),
                    temperature,
                    tiny.dtype,
                    &p,
                ));
            }
        }
        // Ragged cached states (contexts of 7, 2 and 0 rows; the device path pads and masks
        // them in one batched attention), greedy and sampled.
        let ctx = context(200 + i as u64, 3, 7);
        let states: Vec<_> = [7usize, 2, 0]
            .iter()
            .enumerate()
            .map(|(j, &len)| {
                let mut s = d.new_state().unwrap();
                let rows = ctx.get(j).unwrap().narrow(0, 0, len).unwrap();
                d.extend(&mut s, &rows, 4 + j).unwrap();
                s
            })
            .collect();
        let refs: Vec<_> = states.iter().collect();
        for temperature in [0.0, 0.9] {
            let opts = ProposeOptions {
                logit_bias: None,
                in_block: None,
                guides: None,
                temperature,
                seeds: Seeds::Scalar(5),
                top_k: None,
            };
            let p = d.propose_cached(&refs, &[1, 2, 3], &opts).unwrap();
            out.push(case(
                format!("shape {i}, ragged states, T {temperature}"),
                temperature,
                tiny.dtype,
                &p,
            ));
        }
        // Guided blocks (two rows of three): greedy alone (one pass) and under in-block
        // penalties, sampled alone and under penalties (slot by slot).
        for (pens, temperature) in [(false, 0.0), (true, 0.0), (false, 0.8), (true, 0.9)] {
            let (even, _) = multiples(2, tiny.target_vocab);
            let pen = InBlockPenalty {
                presence: 0.5,
                frequency: 1.0,
                seen: vec![],
            };
            let opts = ProposeOptions {
                guides: Some(vec![Some(even.clone()), None, Some(even)]),
                in_block: pens.then(|| vec![pen; 3]),
                temperature,
                seeds: Seeds::Scalar(8),
                ..ProposeOptions::default()
            };
            let p = d.propose_cached(&refs, &[1, 2, 3], &opts).unwrap();
            out.push(case(
                format!("shape {i}, guided, penalties {pens}, T {temperature}"),
                temperature,
                tiny.dtype,
                &p,
            ));
        }
    }
    Value::Array(out)
}

/// One proposal as JSON (non-finite logits as `null`).
fn case(name: String, temperature: f32, dtype: &str, p: &dspark::Proposal) -> Value {
    let finite = |v: &[f32]| -> Vec<Value> {
        v.iter()
            .map(|x| if x.is_finite() { json!(x) } else { json!(null) })
            .collect()
    };
    json!({
        "case": name,
        "greedy": temperature == 0.0,
        "bf16": dtype == "bf16",
        "tokens": p.tokens,
        "logits": finite(&p.draft_logits),
        "confidence": p.confidence.as_deref().map(finite),
    })
}

/// Prints the proposals for the parent (runs, and passes, on its own too).
#[test]
fn print_proposals() {
    // On its own line: the harness prints `test print_proposals ... ` before it.
    println!("\n{MARK}{}", proposals());
}

fn floats(v: &Value) -> Vec<Option<f64>> {
    v.as_array()
        .map(|a| a.iter().map(Value::as_f64).collect())
        .unwrap_or_default()
}

#[test]
fn both_paths_draft_the_same_blocks() {
    let here = kernel_path().unwrap();
    let other = match here {
        KernelPath::Fast => KernelPath::Tensor,
        KernelPath::Tensor | KernelPath::Fused => KernelPath::Fast,
    };
    // This module's test, by its path in the drafter binary.
    let name = concat!(module_path!(), "::print_proposals")
        .split_once("::")
        .map_or("print_proposals", |(_, t)| t);
    let theirs = child_json(name, other, MARK);
    let ours = proposals();
    let (ours, theirs) = (ours.as_array().unwrap(), theirs.as_array().unwrap());
    assert_eq!(ours.len(), theirs.len());
    let mut sampled_same = 0;
    let mut worst = [0f64; 2];
    let mut worst_bf16 = [0f64; 2];
    let (mut bf16_cases, mut bf16_same) = (0, 0);
    for (a, b) in ours.iter().zip(theirs) {
        let case = &a["case"];
        let bf16 = a["bf16"] == json!(true);
        if bf16 {
            bf16_cases += 1;
            if a["tokens"] != b["tokens"] {
                continue;
            }
            bf16_same += 1;
        } else if a["greedy"] == json!(true) {
            assert_eq!(a["tokens"], b["tokens"], "{case}: greedy drafts differ");
        } else if a["tokens"] == b["tokens"] {
            sampled_same += 1;
        }
        let (worst, tol) = if bf16 {
            (&mut worst_bf16, 2e-2)
        } else {
            (&mut worst, 1e-4)
        };
        for (j, key) in ["logits", "confidence"].into_iter().enumerate() {
            let (x, y) = (floats(&a[key]), floats(&b[key]));
            assert_eq!(x.len(), y.len(), "{case}: {key}");
            for (i, (x, y)) in x.iter().zip(&y).enumerate() {
                match (x, y) {
                    (Some(x), Some(y)) => {
                        worst[j] = worst[j].max((x - y).abs());
                        assert!((x - y).abs() <= tol, "{case}: {key}[{i}] {x} vs {y}")
                    }
                    (None, None) => {}
                    _ => panic!("{case}: {key}[{i}] {x:?} vs {y:?} (support differs)"),
                }
            }
        }
    }
    eprintln!(
        "largest differences: draft logits {:.2e}, confidences {:.2e} (bf16: {:.2e}, {:.2e})",
        worst[0], worst[1], worst_bf16[0], worst_bf16[1]
    );
    assert!(worst[1] <= 1e-5, "confidences differ by {:.2e}", worst[1]);
    assert!(
        4 * bf16_same >= 3 * bf16_cases,
        "bf16: {bf16_same} of {bf16_cases} blocks agree"
    );
    // Sampled draws use the same uniforms: a different token needs a draw within rounding of
    // a bucket edge, which these few draws do not hit.
    let sampled = ours
        .iter()
        .filter(|a| a["greedy"] != json!(true) && a["bf16"] != json!(true))
        .count();
    assert_eq!(
        sampled_same, sampled,
        "sampled blocks that differ between the paths"
    );
}
