//! Counter-based randomness: every uniform is a pure function of (stream, tag, slot, index).
//!
//! There is no generator state to advance, so results do not depend on batch order, thread count
//! or how many other draws were made. A row's stream comes from [`Seeds`]: a scalar seed gives
//! row `r` the stream `(seed, r)`, a per-request seed gives row `r` the stream `(seeds[r])`.
//! Drafting, acceptance and residual draws use distinct [`Tag`]s, so they are independent even
//! when a request reuses one seed for all of them.
//!
//! The same seed gives the same draws on every call: a decode loop should derive a fresh seed per
//! round, e.g. with [`round_seed`]`(request_seed, position)`.

use crate::error::{Error, Result};
use crate::view::Seeds;

/// Which family of draws a uniform belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// The draft sampler (one uniform per slot).
    Draft,
    /// The accept/reject test of verification (one uniform per verified draft).
    Accept,
    /// Residual, correction and bonus sampling in verification (one uniform per row).
    Residual,
}

impl Tag {
    fn salt(self) -> u64 {
        match self {
            Tag::Draft => 0x6a09_e667_f3bc_c908,
            Tag::Accept => 0xbb67_ae85_84ca_a73b,
            Tag::Residual => 0x3c6e_f372_fe94_f82b,
        }
    }
}

/// A strong 64-bit bijective mixer (full avalanche; the `rrmxmx` construction).
#[inline]
pub fn mix64(mut v: u64) -> u64 {
    v ^= v.rotate_right(49) ^ v.rotate_right(24);
    v = v.wrapping_mul(0x9fb2_1c65_1e98_df25);
    v ^= v >> 28;
    v = v.wrapping_mul(0x9fb2_1c65_1e98_df25);
    v ^ (v >> 28)
}

/// Hash `v` into `h` (the construction the streams are keyed by; the fused kernels'
/// `ds_combine`).
#[inline]
pub(crate) fn combine(h: u64, v: u64) -> u64 {
    mix64(h ^ mix64(v.wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

/// Derive a per-round seed from a request seed and the position of the anchor token, so that
/// successive rounds of one request draw independent randomness.
pub fn round_seed(seed: u64, position: u64) -> u64 {
    combine(combine(0x5851_f42d_4c95_7f2d, seed), position)
}

/// One row's random stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream(u64);

impl Stream {
    /// The stream of a scalar seed's row `row`.
    pub fn scalar(seed: u64, row: u64) -> Self {
        Stream(combine(combine(0x1405_7b7e_f767_814f, seed), row))
    }

    /// The stream of a per-request seed (independent of the row index).
    pub fn per_request(seed: u64) -> Self {
        Stream(combine(0x2545_f491_4f6c_dd1d, seed))
    }

    /// The stream's key (what the fused GPU kernels receive; [`Stream::from_raw`] inverts it).
    pub fn raw(&self) -> u64 {
        self.0
    }

    /// The stream with key `raw`.
    pub fn from_raw(raw: u64) -> Self {
        Stream(raw)
    }

    /// The raw 64 random bits for `(tag, slot, index)`.
    #[inline]
    pub fn bits(&self, tag: Tag, slot: u64, index: u64) -> u64 {
        combine(combine(combine(self.0, tag.salt()), slot), index)
    }

    /// A uniform in `[0, 1)` with 53 random bits, for `(tag, slot, index)`.
    #[inline]
    pub fn uniform(&self, tag: Tag, slot: u64, index: u64) -> f64 {
        (self.bits(tag, slot, index) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

impl Seeds {
    /// Validate against the batch size (`bad-shape` naming `name` when a per-request list has the
    /// wrong length) and return one [`Stream`] per row.
    pub fn streams(&self, batch: usize, name: &str) -> Result<Vec<Stream>> {
        match self {
            Seeds::Scalar(s) => Ok((0..batch as u64).map(|r| Stream::scalar(*s, r)).collect()),
            Seeds::PerRequest(v) if v.len() == batch => {
                Ok(v.iter().map(|&s| Stream::per_request(s)).collect())
            }
            Seeds::PerRequest(v) => Err(Error::bad_shape(
                name,
                format!("{} per-request seeds for a batch of {batch}", v.len()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniforms_are_in_range_and_roughly_uniform() {
        let s = Stream::scalar(7, 3);
        let n = 200_000;
        let mut bins = [0u32; 10];
        let mut sum = 0.0;
        for i in 0..n {
            let u = s.uniform(Tag::Accept, 0, i);
            assert!((0.0..1.0).contains(&u));
            bins[(u * 10.0) as usize] += 1;
            sum += u;
        }
        let mean = sum / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
        // chi-square with 9 dof; 1e-4 critical value is about 33.7
        let e = n as f64 / 10.0;
        let chi: f64 = bins.iter().map(|&o| (o as f64 - e).powi(2) / e).sum();
        assert!(chi < 33.7, "chi {chi}");
    }

    #[test]
    fn keys_separate_streams_tags_and_slots() {
        let a = Stream::scalar(1, 0);
        assert_ne!(a.bits(Tag::Draft, 0, 0), a.bits(Tag::Accept, 0, 0));
        assert_ne!(a.bits(Tag::Draft, 0, 0), a.bits(Tag::Draft, 1, 0));
        assert_ne!(a.bits(Tag::Draft, 0, 0), a.bits(Tag::Draft, 0, 1));
        assert_ne!(a, Stream::scalar(1, 1));
        assert_ne!(a, Stream::scalar(2, 0));
        assert_ne!(Stream::per_request(1), Stream::per_request(2));
        assert_ne!(round_seed(1, 10), round_seed(1, 11));
        let streams = Seeds::PerRequest(vec![5, 9]).streams(2, "seeds").unwrap();
        assert_eq!(streams[1], Stream::per_request(9));
        let err = Seeds::PerRequest(vec![5]).streams(2, "seeds").unwrap_err();
        assert_eq!(err.code(), "bad-shape");
    }
}
