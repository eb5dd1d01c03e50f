//! The batch-wide look-ahead (`schedule_lengths_batch`): lossless on the paper's Appendix A
//! counterexample, alone and in a batch whose requests' choices read each other's draws; it
//! crosses a row-tile cliff that Algorithm 1 and the single-request look-ahead stop at; and its
//! shapes and fallback.

use crate::sampling_common::appendix_a::appendix_a;
use crate::sampling_common::assert_follows;
use dspark::policy::{
    MAX_BATCH_SEARCH_SLOTS, StepsPerSecond, schedule_lengths, schedule_lengths_ahead,
    schedule_lengths_batch,
};

#[test]
fn appendix_a_alone_is_lossless() {
    // One request: the single-request look-ahead's choices (slot 1 on the promise of slot 2
    // across the cliff at 2 tokens; slot 2 when its own survival pays).
    let sps = StepsPerSecond::step(vec![(1, 1.0), (2, 0.5), (3, 0.45)]).unwrap();
    let lengths = |c: &[f32], _| schedule_lengths_batch(c, 1, 2, &sps, &[0.8, 0.9]).unwrap();
    let counts = appendix_a(1, lengths, 11);
    assert_follows(&counts[0], &[0.7, 0.3], "batch look-ahead, one request");
    assert_eq!(lengths(&[0.8, 0.9], 0), vec![2]);
    assert_eq!(lengths(&[0.8, 0.0], 0), vec![1]);
}

#[test]
fn appendix_a_in_a_batch_is_lossless_where_requests_read_each_others_draws() {
    // Two requests on a table where each one's second slot pays only when the other's does
    // too: request 0's length reads request 1's c_2, which request 1's first draft decides.
    let sps =
        StepsPerSecond::linear(vec![(2, 1.0), (3, 0.9), (4, 0.9), (5, 0.7), (6, 0.7)]).unwrap();
    let ahead = [0.8, 0.9, 0.8, 0.9];
    let lengths = |c: &[f32], _| schedule_lengths_batch(c, 2, 2, &sps, &ahead).unwrap();
    assert_eq!(lengths(&[0.8, 0.9, 0.8, 0.9], 0), vec![2, 2]);
    assert_eq!(lengths(&[0.8, 0.9, 0.8, 0.0], 0), vec![1, 1]);
    assert_eq!(lengths(&[0.8, 0.0, 0.8, 0.9], 0), vec![1, 1]);
    let counts = appendix_a(2, lengths, 12);
    assert_follows(&counts[0], &[0.7, 0.3], "batch look-ahead, request 0");
    assert_follows(&counts[1], &[0.7, 0.3], "batch look-ahead, request 1");
}

/// Expected tokens of a round verifying `lengths` with confidences `c` (`[B·K]`).
fn expected_tokens(c: &[f32], k: usize, lengths: &[usize]) -> f64 {
    let mut tau = lengths.len() as f64;
    for (r, &l) in lengths.iter().enumerate() {
        let mut a = 1.0;
        for &x in &c[r * k..r * k + l] {
            a *= f64::from(x);
            tau += a;
        }
    }
    tau
}

#[test]
fn the_batch_crosses_a_row_tile_cliff_that_one_request_cannot_repay() {
    // A CPU-like table for 4 requests of 8 drafts: a 12-row tile, then a second one (+40%),
    // and the drafter's cost outside the forward.
    let table = StepsPerSecond::linear(
        (1..=36usize)
            .map(|n| {
                let ms = 100.0 + 1.5 * n as f64 + 40.0 * (n.div_ceil(12) - 1) as f64;
                (n, 1e3 / (ms + 60.0))
            })
            .collect(),
    )
    .unwrap();
    let (b, k) = (4, 8);
    let c = vec![0.85f32; b * k];
    let early = schedule_lengths(&c, b, k, &table).unwrap();
    let one = schedule_lengths_ahead(&c, b, k, &table, &c).unwrap();
    let batch = schedule_lengths_batch(&c, b, k, &table, &c).unwrap();
    assert_eq!(early, vec![2; 4]);
    assert_eq!(
        one,
        vec![2; 4],
        "one request's continuation does not repay the tile"
    );
    assert_eq!(batch, vec![5; 4], "four requests' continuations do");
    let theta = |l: &[usize]| expected_tokens(&c, k, l) * table.sps(b + l.iter().sum::<usize>());
    assert!(
        theta(&batch) > 1.2 * theta(&one),
        "{} vs {}",
        theta(&batch),
        theta(&one)
    );
    // Past the cliff, a low slot still ends its request where its survival says.
    let mut dip = c.clone();
    dip[2 * k + 1] = 0.05;
    let got = schedule_lengths_batch(&dip, b, k, &table, &c).unwrap();
    assert_eq!(got, vec![7, 7, 1, 7]);
    // The other requests' slots too poor to repay the tile: the round stays within it, as
    // the early stop's does.
    let poor: Vec<f32> = (0..b * k).map(|i| if i < k { 0.85 } else { 0.2 }).collect();
    let got = schedule_lengths_batch(&poor, b, k, &table, &poor).unwrap();
    assert_eq!(got, vec![8, 0, 0, 0]);
    assert_eq!(got, schedule_lengths(&poor, b, k, &table).unwrap());
}

#[test]
fn shapes_are_checked_and_large_batches_take_the_single_request_look_ahead() {
    let table = StepsPerSecond::linear(vec![(1, 100.0), (4, 90.0), (64, 20.0)]).unwrap();
    let err = schedule_lengths_batch(&[0.5; 4], 2, 2, &table, &[0.5; 3]).unwrap_err();
    assert_eq!(err.code(), "bad-shape");
    let err = schedule_lengths_batch(&[0.5; 3], 2, 2, &table, &[0.5; 4]).unwrap_err();
    assert_eq!(err.code(), "bad-shape");
    assert_eq!(
        schedule_lengths_batch(&[], 0, 8, &table, &[]).unwrap(),
        Vec::<usize>::new()
    );
    // NaN and out-of-range values read as confidences do: NaN ends a request.
    let odd = [f32::NAN, 0.9, 1.5, 0.9];
    assert_eq!(
        schedule_lengths_batch(&odd, 2, 2, &table, &odd).unwrap()[0],
        0
    );
    let (b, k) = (MAX_BATCH_SEARCH_SLOTS / 8 + 1, 8);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let c: Vec<f32> = (0..b * k)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect();
    assert_eq!(
        schedule_lengths_batch(&c, b, k, &table, &c).unwrap(),
        schedule_lengths_ahead(&c, b, k, &table, &c).unwrap()
    );
}
