//! Deterministic test data shared by the unit tests of this crate and the engine's (hidden from
//! the docs; nothing outside tests calls it).

/// `n` values in `[-0.5, 0.5)` from a multiplicative hash of the index and `seed`.
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| hash(i, seed) as f32 / (1u32 << 24) as f32 - 0.5)
        .collect()
}

/// `n` values `(h mod modulus) / div − offset` of the hash `h` of [`values`] (a coarser grid).
pub fn grid(n: usize, seed: u32, modulus: u32, div: f32, offset: f32) -> Vec<f32> {
    (0..n)
        .map(|i| (hash(i, seed) % modulus) as f32 / div - offset)
        .collect()
}

/// A multiplicative hash of index `i` and `seed` (24 bits).
fn hash(i: usize, seed: u32) -> u32 {
    (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8
}
