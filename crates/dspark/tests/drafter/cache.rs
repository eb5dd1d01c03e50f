//! The context KV cache: incremental `extend` + `propose_cached` equals stateless `propose`,
//! rollback with `truncate` equals a fresh state, batching does not mix requests.
use crate::drafter_common::{Tiny, context, load, max_diff};
use candle_core::Tensor;
use dspark::sampling::Seeds;
use dspark::{DraftState, Drafter, Proposal, ProposeOptions};

fn sampled(seed: u64) -> ProposeOptions {
    ProposeOptions {
        logit_bias: None,
        in_block: None,
        guides: None,
        temperature: 0.8,
        seeds: Seeds::Scalar(seed),
        top_k: None,
    }
}

fn assert_same(a: &Proposal, b: &Proposal, tol: f32) {
    assert_eq!((a.batch, a.slots), (b.batch, b.slots));
    assert_eq!(a.tokens, b.tokens);
    let d = max_diff(&a.draft_logits, &b.draft_logits);
    assert!(d <= tol, "draft logits differ by {d}");
    match (&a.confidence, &b.confidence) {
        (Some(x), Some(y)) => assert!(max_diff(x, y) <= tol, "confidence differs"),
        (None, None) => {}
        _ => panic!("confidence presence differs"),
    }
}

/// Rows `[from, to)` of request 0 of a `[1, T, W]` context, as `[to − from, W]`.
fn rows(ctx: &Tensor, from: usize, to: usize) -> Tensor {
    ctx.get(0).unwrap().narrow(0, from, to - from).unwrap()
}

#[test]
fn extend_in_pieces_equals_stateless_propose() {
    let (_dir, d) = load(&Tiny::default());
    let ctx = context(1, 1, 11);
    let start = 3;
    for opts in [ProposeOptions::default(), sampled(5)] {
        let whole = d.propose(&ctx, &[9], &[start], &opts).unwrap();
        let mut s = d.new_state().unwrap();
        d.extend(&mut s, &rows(&ctx, 0, 4), start).unwrap();
        d.extend(&mut s, &rows(&ctx, 4, 5), start + 4).unwrap();
        d.extend(&mut s, &rows(&ctx, 5, 11), start + 5).unwrap();
        assert_eq!((s.start(), s.len(), s.end()), (start, 11, start + 11));
        let cached = d.propose_cached(&[&s], &[9], &opts).unwrap();
        assert_same(&whole, &cached, 1e-5);
        // Proposing does not change the state.
        assert_eq!(s.len(), 11);
    }
}

#[test]
fn positions_are_relative_and_ordered() {
    // RoPE makes attention depend on relative positions only: shifting the whole request
    // changes nothing, while reordering the context rows (which attention without positions
    // could not see) changes the logits.
    let (_dir, d) = load(&Tiny::default());
    let ctx = context(2, 1, 6);
    let opts = sampled(1);
    let a = d.propose(&ctx, &[3], &[0], &opts).unwrap();
    let b = d.propose(&ctx, &[3], &[10], &opts).unwrap();
    assert_same(&a, &b, 1e-4);
    let idx = Tensor::new(&[5u32, 4, 3, 2, 1, 0], &candle_core::Device::Cpu).unwrap();
    let reversed = ctx.index_select(&idx, 1).unwrap();
    let c = d.propose(&reversed, &[3], &[0], &opts).unwrap();
    assert!(max_diff(&a.draft_logits, &c.draft_logits) > 1e-3);
}

#[test]
fn start_positions_past_the_limit_are_too_large() {
    // `start + T` must never wrap (a silent wrong answer in release builds): positions above
    // `limits::MAX_POSITION` are refused before anything is computed.
    let (_dir, d) = load(&Tiny::default());
    let ctx = context(2, 1, 6);
    let opts = sampled(1);
    let max = dspark::limits::MAX_POSITION as usize;
    assert!(d.propose(&ctx, &[3], &[max], &opts).is_ok());
    for start in [max + 1, usize::MAX - 2, usize::MAX] {
        let e = d.propose(&ctx, &[3], &[start], &opts).unwrap_err();
        assert_eq!(e.code(), "too-large", "{e}");
        let mut s = d.new_state().unwrap();
        let e = d.extend(&mut s, &ctx.get(0).unwrap(), start).unwrap_err();
        assert_eq!(e.code(), "too-large", "{e}");
        assert!(e.to_string().contains("start_position"), "{e}");
    }
}

#[test]
fn truncate_then_extend_equals_fresh_state() {
    let (_dir, d) = load(&Tiny::default());
    let ctx = context(3, 1, 12);
    let other = context(4, 1, 12);
    let opts = sampled(2);
    // Fresh: positions 0..8 from `ctx`, then 8..12 from `other` (the "verified" suffix).
    let mut fresh = d.new_state().unwrap();
    d.extend(&mut fresh, &rows(&ctx, 0, 8), 0).unwrap();
    d.extend(&mut fresh, &rows(&other, 8, 12), 8).unwrap();
    // Rolled back: all 12 of `ctx`, truncated to 8, then the same suffix.
    let mut rolled = d.new_state().unwrap();
    d.extend(&mut rolled, &rows(&ctx, 0, 12), 0).unwrap();
    rolled.truncate(8).unwrap();
    assert_eq!(rolled.end(), 8);
    d.extend(&mut rolled, &rows(&other, 8, 12), 8).unwrap();
    let a = d.propose_cached(&[&fresh], &[5], &opts).unwrap();
    let b = d.propose_cached(&[&rolled], &[5], &opts).unwrap();
    assert_same(&a, &b, 1e-6);
    // An overlapping extend skips the rows already held: the wrong suffix stays.
    let mut overlap = d.new_state().unwrap();
    d.extend(&mut overlap, &rows(&ctx, 0, 12), 0).unwrap();
    d.extend(&mut overlap, &rows(&other, 8, 12), 8).unwrap();
    assert_eq!(overlap.len(), 12);
    let c = d.propose_cached(&[&overlap], &[5], &opts).unwrap();
    // And a state holding the wrong suffix does differ.
    let mut wrong = d.new_state().unwrap();
    d.extend(&mut wrong, &rows(&ctx, 0, 12), 0).unwrap();
    let w = d.propose_cached(&[&wrong], &[5], &opts).unwrap();
    assert!(max_diff(&a.draft_logits, &w.draft_logits) > 1e-4);
    assert_same(&w, &c, 1e-6);
    // Overlap that runs past the cache appends only the new rows.
    let mut part = d.new_state().unwrap();
    d.extend(&mut part, &rows(&ctx, 0, 8), 0).unwrap();
    let mut grown = part.clone();
    d.extend(&mut grown, &rows(&ctx, 4, 12), 4).unwrap();
    assert_eq!(grown.len(), 12);
    let g = d.propose_cached(&[&grown], &[5], &opts).unwrap();
    assert_same(&w, &g, 1e-5);
}

#[test]
fn batch_of_different_lengths_equals_one_by_one() {
    let (_dir, d) = load(&Tiny::default());
    let opts = ProposeOptions {
        logit_bias: None,
        in_block: None,
        guides: None,
        seeds: Seeds::PerRequest(vec![11, 12, 13]),
        ..sampled(0)
    };
    let lens = [3usize, 9, 1];
    let anchors = [4u32, 17, 30];
    let mut states: Vec<DraftState> = Vec::new();
    for (i, &t) in lens.iter().enumerate() {
        let mut s = d.new_state().unwrap();
        d.extend(&mut s, &context(20 + i as u64, 1, t).get(0).unwrap(), 2)
            .unwrap();
        states.push(s);
    }
    let refs: Vec<&DraftState> = states.iter().collect();
    let batch = d.propose_cached(&refs, &anchors, &opts).unwrap();
    let (k, v) = (batch.slots, batch.target_vocab);
    for (i, s) in states.iter().enumerate() {
        let one = d
            .propose_cached(
                &[s],
                &anchors[i..=i],
                &ProposeOptions {
                    logit_bias: None,
                    in_block: None,
                    guides: None,
                    seeds: Seeds::PerRequest(vec![11 + i as u64]),
                    ..sampled(0)
                },
            )
            .unwrap();
        assert_eq!(one.tokens, batch.tokens[i * k..(i + 1) * k]);
        let dl = max_diff(
            &one.draft_logits,
            &batch.draft_logits[i * k * v..(i + 1) * k * v],
        );
        assert!(dl <= 1e-5, "request {i}: {dl}");
        let c = batch.confidence.as_ref().unwrap();
        assert!(max_diff(one.confidence.as_ref().unwrap(), &c[i * k..(i + 1) * k]) <= 1e-5);
    }
}

#[test]
fn empty_context_and_state_errors() {
    let (_dir, d) = load(&Tiny::default());
    // No context at all: the block attends to itself only; still a full proposal.
    let empty = d.new_state().unwrap();
    let p = d
        .propose_cached(&[&empty], &[1], &ProposeOptions::default())
        .unwrap();
    assert_eq!(p.tokens.len(), d.info().num_draft_tokens);
    let mut s = d.new_state().unwrap();
    d.extend(&mut s, &rows(&context(5, 1, 4), 0, 4), 0).unwrap();
    // A gap after the cache.
    let e = d
        .extend(&mut s, &rows(&context(5, 1, 4), 0, 2), 6)
        .unwrap_err();
    assert_eq!(e.code(), "invalid-argument");
    assert!(e.to_string().contains("start_position"), "{e}");
    // Truncating beyond the cached length.
    assert_eq!(s.truncate(5).unwrap_err().code(), "invalid-argument");
    s.truncate(0).unwrap();
    assert!(s.is_empty());
    // Wrong feature width.
    let bad = Tensor::zeros((2, 3), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
    let e = d.extend(&mut s, &bad, 0).unwrap_err();
    assert_eq!(e.code(), "bad-shape");
    assert!(e.to_string().contains("features"), "{e}");
    // A state from another drafter shape.
    let foreign = DraftState::new(7);
    let e = d
        .propose_cached(&[&foreign], &[1], &ProposeOptions::default())
        .unwrap_err();
    assert_eq!(e.code(), "invalid-argument");
    // Anchor outside V_in.
    let e = d
        .propose_cached(&[&empty], &[48], &ProposeOptions::default())
        .unwrap_err();
    assert_eq!(e.code(), "token-out-of-range");
    // Mismatched anchors / states.
    let e = d
        .propose_cached(&[&empty], &[1, 2], &ProposeOptions::default())
        .unwrap_err();
    assert_eq!(e.code(), "bad-shape");
}

#[test]
fn a_proposal_for_verification_is_the_same_proposal() {
    // `propose_for_verify` may leave a device path's draft logits where they are; tokens,
    // confidences and the logits' values are those of `propose_cached` on either path.
    let (_dir, d) = load(&Tiny::default());
    let ctx = context(2, 2, 9);
    let mut states = Vec::new();
    for b in 0..2 {
        let mut s = d.new_state().unwrap();
        d.extend(&mut s, &ctx.get(b).unwrap(), 0).unwrap();
        states.push(s);
    }
    let refs: Vec<&DraftState> = states.iter().collect();
    let tensor_path = dspark::device::kernel_path().unwrap() != dspark::device::KernelPath::Fast;
    for opts in [ProposeOptions::default(), sampled(11)] {
        let want = d.propose_cached(&refs, &[9, 4], &opts).unwrap();
        let (got, kept) = d.propose_for_verify(&refs, &[9, 4], &opts).unwrap();
        assert_eq!(got.tokens, want.tokens);
        assert_eq!(got.confidence, want.confidence);
        match kept {
            Some(t) => {
                assert!(tensor_path, "the host path returns its logits on the host");
                assert!(got.draft_logits.is_empty());
                assert_eq!(t.dims(), [2, want.slots, want.target_vocab]);
                let values = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                assert_eq!(values, want.draft_logits);
            }
            None => {
                assert!(!tensor_path, "the device path keeps its logits");
                assert_eq!(got.draft_logits, want.draft_logits);
            }
        }
    }
}
