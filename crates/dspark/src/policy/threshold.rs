//! The static confidence threshold.

use super::check_shape;
use crate::error::{Error, Result};

/// Truncate each request before its first slot with `c < threshold`.
///
/// Errors: `bad-shape` (not `B·K` values), `too-large`, `invalid-argument` (a NaN threshold).
pub fn threshold_lengths(
    confidence: &[f32],
    batch: usize,
    slots: usize,
    threshold: f32,
) -> Result<Vec<usize>> {
    check_shape(confidence, batch, slots, "confidence")?;
    if threshold.is_nan() {
        return Err(Error::invalid("threshold", "NaN"));
    }
    Ok((0..batch)
        .map(|r| {
            (0..slots)
                .position(|j| !matches!(confidence.get(r * slots + j), Some(&c) if c >= threshold))
                .unwrap_or(slots)
        })
        .collect())
}
