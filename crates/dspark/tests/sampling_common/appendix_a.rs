//! The paper's Appendix A counterexample as a harness: which verify-length policies keep
//! speculative sampling lossless.

use dspark::IdMap;
use dspark::sampling::{
    BlockOptions, Floats, Mat, PerRequest, Rows3, Seeds, Tokens, VerifyOptions,
    sample_block_slices, verify_slices,
};

use super::histogram;

/// Trials per request position.
pub const TRIALS: usize = 50_000;

/// Appendix A in batches of `b` requests: each request drafts two tokens from q = (0.5, 0.5)
/// against target p = (0.7, 0.3), with c_1 = 0.8 and c_2 = 0.9 after drafting token 0 but 0
/// after token 1. `policy` sees the batch's `[b·2]` confidences and the trial's index; the
/// result is the histogram of the first committed token of each request position.
pub fn appendix_a(
    b: usize,
    policy: impl Fn(&[f32], usize) -> Vec<usize>,
    seed: u64,
) -> Vec<Vec<u64>> {
    let rows = TRIALS * b;
    let map = IdMap::identity(2).unwrap();
    let base = vec![0f32; rows * 2 * 2];
    let w = vec![0f32; 2];
    let block = sample_block_slices(
        Rows3::new(Floats::F32(&base), [rows, 2, 2]).unwrap(),
        Mat::new(Floats::F32(&w), [2, 1]).unwrap(),
        Mat::new(Floats::F32(&w), [2, 1]).unwrap(),
        &vec![0; rows],
        &BlockOptions {
            temperature: 1.0,
            seeds: Seeds::Scalar(seed),
            id_map: &map,
            top_k: None,
            logit_scale: 1.0,
        },
    )
    .unwrap();
    let confidence = |row: usize| [0.8, if block.tokens[row * 2] == 0 { 0.9 } else { 0.0 }];
    let lengths: Vec<usize> = (0..TRIALS)
        .flat_map(|t| {
            let c: Vec<f32> = (t * b..(t + 1) * b).flat_map(confidence).collect();
            let l = policy(&c, t);
            assert_eq!(l.len(), b);
            l
        })
        .collect();
    let p = [0.7f32.ln(), 0.3f32.ln()];
    let target: Vec<f32> = p.iter().cycle().take(rows * 3 * 2).cloned().collect();
    let drafts: Vec<i64> = block.tokens.iter().map(|&t| i64::from(t)).collect();
    let v = verify_slices(
        Rows3::new(Floats::F32(&target), [rows, 3, 2]).unwrap(),
        Tokens::new(&drafts, [rows, 2]).unwrap(),
        Some(Rows3::new(Floats::F32(&block.draft_logits), [rows, 2, 2]).unwrap()),
        &VerifyOptions {
            temperature: PerRequest::All(1.0),
            seeds: Seeds::Scalar(seed),
            num_draft: Some(lengths),
            ..VerifyOptions::default()
        },
    )
    .unwrap();
    (0..b)
        .map(|r| histogram((0..TRIALS).map(|t| v.tokens[(t * b + r) * 3] as usize), 2))
        .collect()
}
