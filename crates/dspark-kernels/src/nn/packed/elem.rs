//! The element types panels are stored in: `f32`, and `bf16` / `f16` widened to `f32` as they
//! are loaded.
//!
//! Widening is exact for both (bf16 is the top half of an f32; every f16 value, subnormals
//! included, is an f32 value), so a kernel that widens in registers multiplies exactly the
//! numbers the portable kernel multiplies: the same bits on every path. bf16 panels store
//! column pairs ([`PanelElem::PAIR`]) for the pair rule of `pairs.rs`.

use half::{bf16, f16};

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::nn::WeightDtype;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// A panel element type (`f32`, `bf16`, `f16`).
pub trait PanelElem:
    sealed::Sealed + Copy + Default + PartialEq + Send + Sync + std::fmt::Debug + 'static
{
    /// Its [`WeightDtype`].
    const DTYPE: WeightDtype;

    /// Columns per panel slot: 1 (a slot is one column's 16 lanes), or 2 for bf16, whose
    /// slots hold two columns' lanes interleaved (see `pairs.rs`).
    const PAIR: usize;

    /// The value of `v` in this type (round to nearest even when narrowing).
    fn from_f32(v: f32) -> Self;

    /// The exact `f32` value.
    fn to_f32(self) -> f32;

    /// 16 consecutive elements at `p`, widened (AVX-512F).
    ///
    /// # Safety
    /// AVX-512F must be available and `p .. p + 16` readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> __m512;

    /// 8 consecutive elements at `p`, widened (AVX2; F16C for `f16`).
    ///
    /// # Safety
    /// AVX2 and F16C must be available and `p .. p + 8` readable.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> __m256;
}

impl PanelElem for f32 {
    const DTYPE: WeightDtype = WeightDtype::F32;
    const PAIR: usize = 1;

    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY: by the caller's contract.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        // SAFETY: by the caller's contract.
        unsafe { _mm256_loadu_ps(p) }
    }
}

impl PanelElem for bf16 {
    const DTYPE: WeightDtype = WeightDtype::BF16;
    const PAIR: usize = 2;

    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }

    /// The bits shifted into the top half (no NaN quieting, as the vector loads).
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY: by the caller's contract; zero-extend each u16 and shift it up 16 bits.
        unsafe {
            let h = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        // SAFETY: by the caller's contract.
        unsafe {
            let h = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

impl PanelElem for f16 {
    const DTYPE: WeightDtype = WeightDtype::F16;
    const PAIR: usize = 1;

    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        // SAFETY: by the caller's contract (`vcvtph2ps` is AVX-512F for 16 lanes).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        // SAFETY: by the caller's contract (F16C).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every bf16 and f16 bit pattern widens to the f32 that `half` (the reference) gives,
    /// NaNs aside (both give a NaN).
    #[test]
    fn widening_is_exact_for_every_pattern() {
        for bits in 0..=u16::MAX {
            let b = bf16::from_bits(bits);
            let h = f16::from_bits(bits);
            if b.is_nan() {
                assert!(PanelElem::to_f32(b).is_nan());
            } else {
                assert_eq!(PanelElem::to_f32(b).to_bits(), b.to_f32().to_bits());
            }
            if h.is_nan() {
                assert!(PanelElem::to_f32(h).is_nan());
            } else {
                assert_eq!(PanelElem::to_f32(h).to_bits(), h.to_f32().to_bits());
            }
        }
    }

    /// The vector loads widen every pattern to the portable widening's bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_loads_widen_like_the_portable_one() {
        fn check<T: PanelElem>(make: impl Fn(u16) -> T) {
            let all: Vec<T> = (0..=u16::MAX).map(make).collect();
            let want: Vec<u32> = all.iter().map(|v| v.to_f32().to_bits()).collect();
            if crate::cpu::has_avx512() {
                let mut got = vec![0f32; 16];
                for (c, w) in all.chunks_exact(16).zip(want.chunks_exact(16)) {
                    // SAFETY: AVX-512F checked; 16 values readable, 16 writable.
                    unsafe { _mm512_storeu_ps(got.as_mut_ptr(), T::load16(c.as_ptr())) };
                    let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(bits, w, "{:?}", T::DTYPE);
                }
            }
            if crate::cpu::has_avx2() && std::arch::is_x86_feature_detected!("f16c") {
                let mut got = vec![0f32; 8];
                for (c, w) in all.chunks_exact(8).zip(want.chunks_exact(8)) {
                    // SAFETY: AVX2 and F16C checked; 8 values readable, 8 writable.
                    unsafe { _mm256_storeu_ps(got.as_mut_ptr(), T::load8(c.as_ptr())) };
                    let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(bits, w, "{:?}", T::DTYPE);
                }
            }
        }
        check(bf16::from_bits);
        check(f16::from_bits);
        check(|b| f32::from_bits(u32::from(b) * 65_537));
    }
}
