//! Activations quantized per row and block, as every product's first step: the rule's
//! [`quantize_block`] on each block of each row, with an AVX2 body for whole blocks that gives
//! the same bits (a 9-row verification of a 0.6 B target quantizes about 80,000 values a layer;
//! the scalar rule spent more time on them than the kernels on the weights).

use super::rule::{BLOCK, quantize_block};

/// Activations quantized per row and block: `blocks` scales, `blocks · 32` bytes and `blocks`
/// byte sums per row.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantRows {
    /// Blocks per row.
    pub blocks: usize,
    /// `[n, blocks]` scales.
    pub d: Vec<f32>,
    /// `[n, blocks · 32]` bytes.
    pub qs: Vec<i8>,
    /// `[n, blocks]` sums of each block's bytes (a kernel that offsets the weights by 128 to
    /// multiply unsigned by signed bytes takes `128 · sum` back out).
    pub sums: Vec<i32>,
}

impl QuantRows {
    /// Quantize row-major `x: [n, cols]` (each row's last block zero-padded).
    pub fn new(x: &[f32], n: usize, cols: usize) -> Self {
        let blocks = cols.div_ceil(BLOCK);
        let mut d = vec![0.0f32; n * blocks];
        let mut qs = vec![0i8; n * blocks * BLOCK];
        quantize_rows(x, n, cols, BLOCK, &mut d, &mut qs);
        let sums = qs
            .chunks_exact(BLOCK)
            .map(|q| q.iter().map(|&v| i32::from(v)).sum())
            .collect();
        Self {
            blocks,
            d,
            qs,
            sums,
        }
    }

    /// Row `r`'s scales, bytes and block sums.
    pub fn row(&self, r: usize) -> (&[f32], &[i8], &[i32]) {
        let b = self.blocks;
        (
            &self.d[r * b..(r + 1) * b],
            &self.qs[r * b * BLOCK..(r + 1) * b * BLOCK],
            &self.sums[r * b..(r + 1) * b],
        )
    }
}

/// Row-major `x: [n, cols]` in blocks of `block` values (each row's last one zero-padded):
/// `d` gets `[n, ⌈cols / block⌉]` scales and `qs` `[n, ⌈cols / block⌉ · block]` bytes.
pub(crate) fn quantize_rows(
    x: &[f32],
    n: usize,
    cols: usize,
    block: usize,
    d: &mut [f32],
    qs: &mut [i8],
) {
    let blocks = cols.div_ceil(block);
    #[cfg(target_arch = "x86_64")]
    let simd = block.is_multiple_of(32) && crate::cpu::has_avx2();
    for (i, (q, scale)) in qs
        .chunks_exact_mut(block)
        .zip(d.iter_mut())
        .take(n * blocks)
        .enumerate()
    {
        let (r, b) = (i / blocks, i % blocks);
        let row = &x[r * cols..(r + 1) * cols];
        let values = &row[(b * block).min(cols)..((b + 1) * block).min(cols)];
        #[cfg(target_arch = "x86_64")]
        if simd && values.len() == block {
            // SAFETY: AVX2 and FMA were detected; `values` and `q` are `block` long, a multiple
            // of 32.
            *scale = unsafe { x86::quantize_block(values, q) };
            continue;
        }
        *scale = quantize_block(values, q);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::quantize_block`] for a whole block (`x.len() == q.len()`, a multiple of 32):
    /// the same maximum (NaN ignored, as `f32::max` does), the same `1 / d` and products, and
    /// [`crate::nn::quant::rule::level`]'s rounding per lane.
    ///
    /// # Safety
    /// AVX2 must be available; `x.len() == q.len()`, a multiple of 32.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
        let sign = _mm256_set1_ps(-0.0);
        let mut amax = _mm256_setzero_ps();
        for c in x.chunks_exact(8) {
            // SAFETY: 8 readable floats.
            let v = _mm256_andnot_ps(sign, unsafe { _mm256_loadu_ps(c.as_ptr()) });
            // `maxps` returns its second operand when either is NaN: a NaN lane is skipped.
            amax = _mm256_max_ps(v, amax);
        }
        let mut lanes = [0.0f32; 8];
        // SAFETY: 8 writable floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), amax) };
        let amax = lanes.iter().fold(0.0f32, |m, &v| m.max(v));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(128.0));
        let (half, neg_half) = (_mm256_set1_ps(0.5), _mm256_set1_ps(-0.5));
        let (min, max) = (_mm256_set1_epi32(-127), _mm256_set1_epi32(127));
        let level = |p: *const f32| {
            // SAFETY: 8 readable floats at `p`.
            let v = _mm256_mul_ps(unsafe { _mm256_loadu_ps(p) }, id);
            // NaN lanes to 0, then clamped to ±128 (the scalar rule's order).
            let v = _mm256_and_ps(v, _mm256_cmp_ps::<_CMP_ORD_Q>(v, v));
            let v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
            let t = _mm256_cvttps_epi32(v);
            let f = _mm256_sub_ps(v, _mm256_cvtepi32_ps(t));
            // A true compare is all ones (−1): up by one at f ≥ 0.5, down at f ≤ −0.5.
            let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(f, half));
            let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(f, neg_half));
            let r = _mm256_add_epi32(_mm256_sub_epi32(t, up), down);
            _mm256_min_epi32(_mm256_max_epi32(r, min), max)
        };
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (c, out) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)) {
            let p = c.as_ptr();
            // SAFETY: `c` is 32 floats: 4 loads of 8.
            let [a, b, e, f] = [0, 8, 16, 24].map(|k| level(unsafe { p.add(k) }));
            // Packed per 128-bit half, then the 8 four-byte pieces put back in order.
            let bytes = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(e, f));
            let bytes = _mm256_permutevar8x32_epi32(bytes, order);
            // SAFETY: `out` is 32 writable bytes.
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), bytes) };
        }
        d
    }
}
