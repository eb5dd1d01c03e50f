//! Measuring a target's steps-per-second table (the scheduler's `SPS(n)`: forwards per second
//! as a function of the total number of tokens verified in one forward).

use std::time::Instant;

use super::target::{LogitRows, TargetInput, TargetModel};
use crate::error::{Error, Result};
use crate::sampling::StepsPerSecond;

/// Context tokens each profiling row holds before the timed forwards.
const PROFILE_CONTEXT: usize = 32;

/// Timed repeats per size (the fastest counts: the others carry noise from the machine).
const PROFILE_REPEATS: usize = 3;

/// Measure `SPS(n)` on `target` for `n` in powers of two up to `max_tokens` (and `max_tokens`
/// itself), spreading `n` verified tokens over rows of at most `row_tokens` each, every row
/// after a short context, the way a batched verification looks. Uses a throwaway cache.
///
/// Errors: `invalid-argument` for zero sizes, and the target's own errors.
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
    let vocab = target.vocab_size().max(1);
    let token = |i: usize| ((i * 7919 + 13) % vocab) as u32;
    let mut sizes: Vec<usize> = (0..)
        .map(|p| 1usize << p)
        .take_while(|&n| n < max_tokens)
        .collect();
    sizes.push(max_tokens);
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
    let mut points = Vec::with_capacity(sizes.len());
    for &n in &sizes {
        let mut num = vec![0usize; rows];
        for (r, slot) in num.iter_mut().enumerate() {
            *slot = n.saturating_sub(r * row_tokens).min(row_tokens);
        }
        let ids: Vec<u32> = (0..rows * row_tokens).map(token).collect();
        let input = TargetInput {
            tokens: &ids,
            width: row_tokens,
            num_tokens: &num,
            logits: LogitRows::All,
        };
        let mut best = f64::INFINITY;
        for _ in 0..PROFILE_REPEATS {
            let t = Instant::now();
            target.forward(&mut cache, &input, &[])?;
            best = best.min(t.elapsed().as_secs_f64());
            target.truncate(&mut cache, &base)?;
        }
        points.push((n, 1.0 / best.max(1e-9)));
    }
    StepsPerSecond::linear(points)
}
