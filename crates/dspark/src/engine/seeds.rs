//! Where every random draw of a request comes from: one stream per `(seed, position, use)`.
//!
//! A request's draws are keyed by its own seed and the position they are drawn at, never by its
//! index in a batch: the same request gives the same tokens alone, in any batch, joining a
//! running batch at any time, or resumed after a preemption (its positions are the same).

/// What a seed is used for (the `salt` of [`derive_seed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    /// The first token, sampled from the prefill's last row.
    Prefill = 0,
    /// A round's draft block.
    Draft = 1,
    /// A round's verification.
    Verify = 2,
    /// A request's stream derived from a call-level seed ([`call_seed`]).
    Call = 3,
}

/// The seed of request `index` of a call with call-level seed `seed`: a stream of its own
/// (the requests of one call are independent samples), the same for the same seed and index.
pub fn call_seed(seed: u64, index: usize) -> u64 {
    derive_seed(seed, index as u64, 0, Use::Call as u64)
}

/// A seed from fresh entropy, for a request that asked for none: two such requests are
/// independent samples, and a rerun samples anew. (The standard library's per-process random
/// keys, a counter and the clock, hashed.)
pub fn fresh_seed() -> u64 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static KEYS: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    KEYS.get_or_init(std::collections::hash_map::RandomState::new)
        .hash_one((n, clock, std::process::id()))
}

/// One 63-bit seed per `(seed, request, position, use)`: an independent stream for every draw
/// (SplitMix64 finalizer over a weighted sum, all arithmetic mod 2⁶⁴). Pinned values
/// guard it: a changed formula changes every seeded request's tokens.
pub fn derive_seed(seed: u64, request: u64, position: u64, salt: u64) -> u64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(request.wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add(position.wrapping_mul(0x94D0_49BB_1331_11EB))
        .wrapping_add(salt);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) & ((1 << 63) - 1)
}

/// The seed of a request's draws for `what` at `position`: [`derive_seed`] of its own seed,
/// never of where it sits in a batch.
pub(crate) fn request_seed(seed: u64, position: usize, what: Use) -> u64 {
    derive_seed(seed, 0, position as u64, what as u64)
}

#[cfg(test)]
mod tests {
    use super::derive_seed;

    #[test]
    fn call_and_fresh_seeds_differ_per_request() {
        use super::{call_seed, fresh_seed};
        assert_eq!(call_seed(7, 3), call_seed(7, 3));
        assert_ne!(call_seed(7, 3), call_seed(7, 4));
        assert_ne!(call_seed(7, 3), call_seed(8, 3));
        let fresh: std::collections::HashSet<u64> = (0..1000).map(|_| fresh_seed()).collect();
        assert_eq!(fresh.len(), 1000);
    }

    #[test]
    fn derive_seed_keeps_its_pinned_values() {
        assert_eq!(derive_seed(0, 0, 0, 0), 0);
        assert_eq!(derive_seed(1234, 0, 7, 2), 8421061507603747359);
        assert_eq!(derive_seed(1234, 1, 7, 2), 318230662786112393);
        assert_eq!(derive_seed(u64::MAX - 4, 3, 100, 1), 3670197831097064398);
    }
}
