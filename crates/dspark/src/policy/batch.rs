//! The batch-wide look-ahead: each request's next slot is admitted when the best round that
//! holds it beats the best round that stops the request before it, both searched over the
//! whole batch, on what the slot's verification cannot condition.

use super::early_stop::{ranked, scan};
use super::table::StepsPerSecond;
use super::{check_shape, conf};
use crate::error::Result;

/// The most slots (`B·K`) searched slot by slot. The search costs `O((B·K)²)` at worst; past
/// this a batch takes [`schedule_lengths_ahead`](super::schedule_lengths_ahead)'s scan (at
/// `B·K = 512`, under 10⁶ additions).
pub const MAX_BATCH_SEARCH_SLOTS: usize = 512;

/// Algorithm 1's objective `Θ = τ·SPS(n)` maximised over the whole batch for each slot, where
/// the early stop only looks one slot ahead.
///
/// Request `r` verifies slot `j` when its slots `< j` are verified and the best `Θ` of a round
/// that verifies `(r, j)` strictly beats the best `Θ` of one that stops `r` at `j` slots. Each
/// best is searched over how many of the other slots the round also verifies, taken by
/// survival (highest first): every other request's slots at their current survival, and
/// `r`'s own slots past `j` (for the first best) at `a_{r,j}·Π ahead[r·K + j+1..=i]`, the
/// acceptance predicted WITHOUT this round's draws, as in
/// [`schedule_lengths_ahead`](super::schedule_lengths_ahead). A slot of survival 0 ends a
/// search: it is never worth a token of the forward.
///
/// So a round crosses a cliff in the table (a kernel's row tile, a CUDA-graph size) when the
/// slots of the whole batch past it repay it, where Algorithm 1 stops at the first slot that
/// lowers `Θ` and the single-request look-ahead only sees that request's continuation.
///
/// Lossless as the early stop is: the choice for `(r, j)` reads `r`'s survivals up to `j`
/// (`c_{r,i}` reads the drafts before `i`), `ahead`, and the other requests' confidences,
/// which their own draws decide, never `r`'s draft `j` or later, which the verification of
/// `(r, j)` conditions. Values are read as confidences are (clamped to `[0, 1]`, NaN as 0).
/// Batches of more than [`MAX_BATCH_SEARCH_SLOTS`] slots take the single-request look-ahead.
///
/// Errors: `bad-shape` (`confidence` or `ahead` not `B·K` values), `too-large`.
pub fn schedule_lengths_batch(
    confidence: &[f32],
    batch: usize,
    slots: usize,
    sps: &StepsPerSecond,
    ahead: &[f32],
) -> Result<Vec<usize>> {
    check_shape(confidence, batch, slots, "confidence")?;
    check_shape(ahead, batch, slots, "ahead")?;
    if batch * slots > MAX_BATCH_SEARCH_SLOTS {
        return Ok(scan(confidence, batch, slots, sps, Some(ahead)));
    }
    let all: Vec<(f64, usize)> = ranked(confidence, batch, slots)
        .into_iter()
        .map(|(a, r, _)| (a, r))
        .collect();
    let mut lengths = vec![0; batch];
    let mut continuation = Vec::with_capacity(slots);
    for (r, length) in lengths.iter_mut().enumerate() {
        // τ and tokens of the round with `r`'s admitted slots (and every request's bonus).
        let (mut tau, mut survival) = (batch as f64, 1.0);
        for j in 0..slots {
            survival *= conf(confidence, r * slots + j);
            if survival <= 0.0 {
                break;
            }
            continuation.clear();
            let mut s = survival;
            for i in j + 1..slots {
                s *= conf(ahead, r * slots + i);
                continuation.push(s);
            }
            let tokens = batch + j;
            let with = best(&all, r, &continuation, tau + survival, tokens + 1, sps);
            let without = best(&all, r, &[], tau, tokens, sps);
            if with <= without {
                break;
            }
            tau += survival;
            *length = j + 1;
        }
    }
    Ok(lengths)
}

/// The best `Θ = (tau + Σ added)·SPS(tokens + added)` over adding any number of the highest
/// survivals among the slots of `all` (ranked, highest first) not of request `skip`, merged
/// with `extra` (highest first), stopping at a survival of 0.
fn best(
    all: &[(f64, usize)],
    skip: usize,
    extra: &[f64],
    tau: f64,
    tokens: usize,
    sps: &StepsPerSecond,
) -> f64 {
    let mut others = all.iter().filter(|s| s.1 != skip).map(|s| s.0).peekable();
    let mut extra = extra.iter().copied().peekable();
    let (mut tau, mut tokens) = (tau, tokens);
    let mut theta = tau * sps.sps(tokens);
    loop {
        let next = match (others.peek(), extra.peek()) {
            (Some(o), Some(e)) if e > o => extra.next(),
            (Some(_), _) => others.next(),
            (None, _) => extra.next(),
        };
        match next {
            Some(a) if a > 0.0 => {
                tau += a;
                tokens += 1;
                theta = theta.max(tau * sps.sps(tokens));
            }
            _ => return theta,
        }
    }
}
