//! Measuring a target's steps-per-second table (the scheduler's `SPS(n)`: forwards per second
//! as a function of the total number of tokens verified in one forward).

use std::time::Instant;

use crate::error::{Error, Result};
use crate::limits::{MAX_BATCH, MAX_BLOCK, at_most};
use crate::models::{LogitRows, TargetInput, TargetModel};
use crate::policy::StepsPerSecond;
use crate::policy::table::median;

/// Context tokens each profiling row holds before the timed forwards.
const PROFILE_CONTEXT: usize = 32;

/// Timed repeats per size in the dense range; their median counts. A size past it is timed
/// once: a forward that long averages the machine's noise over its length, it costs as much as
/// many small ones, and the loop's own forwards refine the table from the first round on (the
/// policy room's `learned` module).
///
/// The median, not the fastest: every size then holds a typical forward, as the one timing of
/// a large size does. The refinement scales the whole table by the median ratio of the loop's
/// forwards to it; with the fastest of 3 in the dense range that ratio came out near 1.13 on
/// the memory-bound pair (f32, 4 requests) and priced the large sizes 13% above what they cost,
/// so the scheduler kept its rounds short of them.
const PROFILE_REPEATS: usize = 3;

/// The most verified tokens the engine profiles for [`VerifyPolicy::ScheduledMeasured`]
/// (larger batches read the table past its end: tokens/s held constant).
///
/// [`VerifyPolicy::ScheduledMeasured`]: crate::policy::VerifyPolicy::ScheduledMeasured
pub const MAX_PROFILE_TOKENS: usize = 4096;

/// Past the dense range, each profiled size is at most this factor above the previous one (the
/// table interpolates between them; a forward's cost is close to linear there).
const PROFILE_GROWTH: f64 = 1.5;

/// The sizes [`measure_steps_per_second`] times: every `n` up to `2·row_tokens` (a kernel's
/// row tiling puts steps in the cost of small forwards, where one round's verify length
/// decides; the scheduler's early stop must see them), then sizes growing by at most
/// [`PROFILE_GROWTH`], and `max_tokens` itself.
pub(crate) fn profile_sizes(max_tokens: usize, row_tokens: usize) -> Vec<usize> {
    let dense = max_tokens.min(row_tokens.saturating_mul(2).max(1));
    let mut sizes: Vec<usize> = (1..=dense).collect();
    let mut n = dense;
    while n < max_tokens {
        n = ((n as f64 * PROFILE_GROWTH) as usize).clamp(n + 1, max_tokens);
        sizes.push(n);
    }
    sizes
}

/// Measure `SPS(n)` on `target` for every `n` up to `2·row_tokens` (a kernel's row tiling puts
/// steps in the cost of small forwards), each the median of 3 timed forwards (taken round all
/// sizes in turn), then sizes growing by at most 50% up to `max_tokens`, timed once. `n` verified tokens
/// are spread over rows of at most `row_tokens` each, every row after a short context, the
/// way a batched verification looks. Uses a throwaway cache.
///
/// Errors: `invalid-argument` for zero sizes, `too-large` past [`MAX_BATCH`] tokens or
/// [`MAX_BLOCK`] + 1 tokens per row, and the target's own errors.
pub fn measure_steps_per_second<T: TargetModel>(
    target: &T,
    max_tokens: usize,
    row_tokens: usize,
) -> Result<StepsPerSecond> {
    if max_tokens == 0 || row_tokens == 0 {
        return Err(Error::invalid(
            "max_tokens",
            "profiling needs at least one token per row and in total",
        ));
    }
    at_most("max_tokens", max_tokens as u64, MAX_BATCH)?;
    at_most("row_tokens", row_tokens as u64, MAX_BLOCK + 1)?;
    // A table needs two sizes: a profile of one token times two.
    let max_tokens = max_tokens.max(2);
    let vocab = target.vocab_size().max(1);
    let token = |i: usize| ((i * 7919 + 13) % vocab) as u32;
    let sizes = profile_sizes(max_tokens, row_tokens);
    let rows = max_tokens.div_ceil(row_tokens);
    let mut cache = target.new_cache(rows)?;
    let context: Vec<u32> = (0..rows * PROFILE_CONTEXT).map(token).collect();
    target.forward(
        &mut cache,
        &TargetInput {
            tokens: &context,
            width: PROFILE_CONTEXT,
            num_tokens: &vec![PROFILE_CONTEXT; rows],
            logits: LogitRows::Last,
        },
        &[],
    )?;
    let base = target.cache_lengths(&cache);
    let inputs: Vec<(Vec<u32>, Vec<usize>)> = sizes
        .iter()
        .map(|&n| {
            let num = (0..rows)
                .map(|r| n.saturating_sub(r * row_tokens).min(row_tokens))
                .collect();
            ((0..rows * row_tokens).map(token).collect(), num)
        })
        .collect();
    // The repeats go round all sizes in turn, so a slow spell of the machine does not bias
    // one size.
    let mut timed: Vec<Vec<f64>> = vec![Vec::with_capacity(PROFILE_REPEATS); sizes.len()];
    let dense = max_tokens.min(row_tokens.saturating_mul(2));
    for repeat in 0..PROFILE_REPEATS {
        for (((ids, num), times), &n) in inputs.iter().zip(&mut timed).zip(&sizes) {
            if repeat > 0 && n > dense {
                continue;
            }
            let input = TargetInput {
                tokens: ids,
                width: row_tokens,
                num_tokens: num,
                logits: LogitRows::All,
            };
            let t = Instant::now();
            target.forward(&mut cache, &input, &[])?;
            times.push(t.elapsed().as_secs_f64());
            target.truncate(&mut cache, &base)?;
        }
    }
    let points = sizes
        .iter()
        .zip(timed)
        .map(|(&n, times)| (n, 1.0 / median(times).unwrap_or(0.0).max(1e-9)))
        .collect();
    StepsPerSecond::linear(points)
}

#[cfg(test)]
mod tests {
    use super::profile_sizes;

    #[test]
    fn sizes_are_dense_over_two_rows_then_geometric_up_to_the_maximum() {
        assert_eq!(profile_sizes(9, 9), (1..=9).collect::<Vec<_>>());
        assert_eq!(profile_sizes(1, 9), vec![1]);
        let s = profile_sizes(288, 9);
        assert_eq!(&s[..18], &(1..=18).collect::<Vec<_>>()[..]);
        assert_eq!(s.last(), Some(&288));
        for w in s.windows(2) {
            assert!(w[0] < w[1], "{s:?}");
            assert!(
                w[1] as f64 <= (w[0] as f64 * 1.5).max(w[0] as f64 + 1.0),
                "{s:?}"
            );
        }
        assert!(s.len() < 30, "{} sizes", s.len());
    }
}
