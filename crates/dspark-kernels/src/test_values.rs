//! Deterministic test data shared by the unit tests of this crate and the engine's (hidden from
//! the docs; nothing outside tests calls it).

/// `n` values in `[-0.5, 0.5)` from a multiplicative hash of the index and `seed`.
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
            h as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}
