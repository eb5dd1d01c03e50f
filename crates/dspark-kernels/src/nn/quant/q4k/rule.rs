//! The Q4_K rule: the format (GGUF's `block_q4_K`), how dspark quantizes a super-block, and the
//! arithmetic of a product, which every kernel follows to the bit (this file is the portable
//! kernel and the reference the x86 one is tested against).
//!
//! **Super-blocks.** 256 consecutive weights of a row, in 8 sub-blocks of 32. Sub-block `s` has
//! a 6-bit scale `sc_s` and a 6-bit min `m_s`; the super-block two f16 factors `d` and `dmin`;
//! each weight a 4-bit `q` in `0..=15`. The weight is `(d · sc_s) · q − dmin · m_s`. Stored as
//! GGUF stores it (144 bytes): `d`, `dmin`, the 16 six-bit values packed in 12 bytes ([`pack`]),
//! then 128 bytes of nibbles: bytes `32c .. 32c + 32` hold sub-block `2c` in their low nibbles
//! and `2c + 1` in their high ones.
//!
//! **Activations.** Each row's 256-value blocks are quantized as Q8_0's are (one f32 scale
//! `max|x| / 127`, bytes rounded half away from zero), and each 32-value sub-block's byte sum is
//! kept beside them (`bsum_s`).
//!
//! **Products.** Per super-block `b` of row `o` of `W` and row `r` of `x`, two exact integer
//! sums, `isum = Σ_s sc_s · Σ_i q_i · x_i` and `msum = Σ_s m_s · bsum_s`; then, over the
//! super-blocks in order from `0.0`, `acc = fma(f32(isum), f32(d) · d_x, acc)` and
//! `acc = fma(−f32(msum), f32(dmin) · d_x, acc)`, each product of scales rounded once; then
//! `+ bias`. A row's result never depends on the other rows of the call.
//!
//! **Layout.** Rows are stored in groups of [`GROUP`] (the last one zero-padded; a row's last
//! super-block too): for each group and super-block, the 8 rows' `d`, their `dmin`, their scale
//! bytes, then their nibbles ([`GroupQ4K`], 8 × 144 bytes). Scale bytes and nibble bytes are
//! interleaved 4 at a time across the rows ([`quad_at`]), so one 32-byte load holds the same
//! 4 bytes of every row: the kernels unpack the 8 rows' scales together, and each nibble word
//! against 4 activation bytes adds one partial sum per row, lane `j` row `j`'s.

use half::f16;

use super::super::rule::{GROUP, quad_at};
use super::search;

/// Weights per super-block.
pub const SUPER: usize = 256;

/// Weights per sub-block.
pub const SUB: usize = 32;

/// Sub-blocks per super-block.
pub const SUBS: usize = SUPER / SUB;

/// Bytes of one row's super-block in a GGUF file (`block_q4_K`).
pub const BLOCK_BYTES: usize = 144;

/// Bytes of a row's packed scales and mins.
pub const SCALE_BYTES: usize = 12;

/// One super-block of a group of [`GROUP`] rows, in GGUF's fields (bytes interleaved across the
/// rows, [`quad_at`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct GroupQ4K {
    /// Row `j`'s scale of its sub-block scales.
    pub d: [f16; GROUP],
    /// Row `j`'s scale of its sub-block mins.
    pub dmin: [f16; GROUP],
    /// The rows' 8 scales and 8 mins, 6 bits each ([`pack`]): byte `i` of row `j` at
    /// [`quad_at`]`(j, i)`.
    pub scales: [u8; GROUP * SCALE_BYTES],
    /// The rows' 128 nibble bytes: byte `i` of row `j` at [`quad_at`]`(j, i)`.
    pub qs: [u8; GROUP * SUPER / 2],
}

impl Default for GroupQ4K {
    fn default() -> Self {
        Self {
            d: [f16::ZERO; GROUP],
            dmin: [f16::ZERO; GROUP],
            scales: [0; GROUP * SCALE_BYTES],
            qs: [0; GROUP * SUPER / 2],
        }
    }
}

impl GroupQ4K {
    /// Row `j`'s packed scales and mins, in GGUF's order.
    pub fn scales_of(&self, j: usize) -> [u8; SCALE_BYTES] {
        std::array::from_fn(|i| self.scales[quad_at(j, i)])
    }

    /// Row `j`'s 128 nibble bytes, in GGUF's order.
    pub fn nibbles_of(&self, j: usize) -> [u8; SUPER / 2] {
        std::array::from_fn(|i| self.qs[quad_at(j, i)])
    }

    /// Set row `j`'s packed scales and nibble bytes (GGUF's order).
    pub fn set_row(&mut self, j: usize, scales: &[u8; SCALE_BYTES], qs: &[u8; SUPER / 2]) {
        for (i, &v) in scales.iter().enumerate() {
            self.scales[quad_at(j, i)] = v;
        }
        for (i, &v) in qs.iter().enumerate() {
            self.qs[quad_at(j, i)] = v;
        }
    }
}

/// Sub-block scales `sc` and mins `m` (6 bits each) as GGUF packs them: bytes 0–3 hold scales
/// 0–3, bytes 4–7 mins 0–3, each with the top 2 bits of scale (or min) `s + 4` above them;
/// bytes 8–11 hold the low 4 bits of scale `s + 4` and, above them, of min `s + 4`.
pub fn pack(sc: &[u8; SUBS], m: &[u8; SUBS]) -> [u8; 12] {
    let mut out = [0u8; 12];
    for s in 0..4 {
        out[s] = (sc[s] & 63) | ((sc[s + 4] >> 4) << 6);
        out[s + 4] = (m[s] & 63) | ((m[s + 4] >> 4) << 6);
        out[s + 8] = (sc[s + 4] & 15) | ((m[s + 4] & 15) << 4);
    }
    out
}

/// [`pack`]'s inverse, as four 32-bit words: `(scales, mins)`, 8 bytes each.
#[inline]
pub fn unpack(packed: &[u8; 12]) -> ([u8; SUBS], [u8; SUBS]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([0, 1, 2, 3].map(|k| packed[4 * i + k]));
    let (a, b, c) = (word(0), word(1), word(2));
    let sc_lo = a & LOW6;
    let sc_hi = (c & LOW4) | (((a >> 6) & LOW2) << 4);
    let m_lo = b & LOW6;
    let m_hi = ((c >> 4) & LOW4) | (((b >> 6) & LOW2) << 4);
    let join = |lo: u32, hi: u32| {
        let mut v = [0u8; SUBS];
        v[..4].copy_from_slice(&lo.to_le_bytes());
        v[4..].copy_from_slice(&hi.to_le_bytes());
        v
    };
    (join(sc_lo, sc_hi), join(m_lo, m_hi))
}

/// Nibble `i` (`0..256`) of a row's super-block.
#[inline]
pub fn nibble(qs: &[u8; SUPER / 2], i: usize) -> u8 {
    let (s, k) = (i / SUB, i % SUB);
    let byte = qs[(s / 2) * SUB + k];
    if s % 2 == 0 { byte & 15 } else { byte >> 4 }
}

/// `v` rounded to a level in `0..=max` (`v + 0.5` truncated: no libm call in the quantizer's
/// inner loops; below 0, and NaN, give 0).
#[inline]
fn level(v: f32, max: u8) -> u8 {
    ((v + 0.5) as u8).min(max)
}

/// A row's super-block `x` (at most [`SUPER`] values; missing ones count as 0) as `(d, dmin,
/// scales, nibbles)`. `None` when a factor does not fit an f16 (weights above about
/// 65504 · 63 · 15 in size); `x` must be finite.
pub fn quantize_super(x: &[f32]) -> Option<(f16, f16, [u8; 12], [u8; SUPER / 2])> {
    let mut padded = [0.0f32; SUPER];
    padded[..x.len()].copy_from_slice(x);
    let fits: [(f32, f32); SUBS] =
        std::array::from_fn(|s| search::fit_sub(&padded[s * SUB..][..SUB]));
    let amax = fits.iter().fold(0.0f32, |m, f| m.max(f.0));
    let mmax = fits.iter().fold(0.0f32, |m, f| m.max(f.1));
    let (d, dmin) = (f16::from_f32(amax / 63.0), f16::from_f32(mmax / 63.0));
    if !(d.is_finite() && dmin.is_finite()) {
        return None;
    }
    let (df, mf) = (d.to_f32(), dmin.to_f32());
    let six = |v: f32, by: f32| if by > 0.0 { level(v / by, 63) } else { 0 };
    let sc: [u8; SUBS] = fits.map(|f| six(f.0, df));
    let m: [u8; SUBS] = fits.map(|f| six(f.1, mf));
    let mut qs = [0u8; SUPER / 2];
    for (s, x) in padded.chunks_exact(SUB).enumerate() {
        let (step, off) = (df * f32::from(sc[s]), mf * f32::from(m[s]));
        if step > 0.0 {
            // `level((v + off) / step, 15)` in the form that vectorizes (the same levels).
            let shift = 4 * (s % 2);
            for (byte, &v) in qs[(s / 2) * SUB..][..SUB].iter_mut().zip(x) {
                *byte |= search::level15((v + off) / step) << shift;
            }
        }
    }
    Some((d, dmin, pack(&sc, &m), qs))
}

/// Row `j` of a group super-block as `f32` weights (`(d · sc) · q − dmin · m`), into `out` (its
/// first `out.len()` weights).
pub fn dequantize_row(block: &GroupQ4K, j: usize, out: &mut [f32]) {
    let (sc, m) = unpack(&block.scales_of(j));
    let (d, dmin) = (block.d[j].to_f32(), block.dmin[j].to_f32());
    let qs = block.nibbles_of(j);
    for (i, w) in out.iter_mut().enumerate() {
        let s = i / SUB;
        let q = f32::from(nibble(&qs, i));
        *w = d * f32::from(sc[s]) * q - dmin * f32::from(m[s]);
    }
}

/// Activations quantized per row and 256-value block, with each 32-value sub-block's byte sum.
#[derive(Debug, Clone, PartialEq)]
pub struct Q8KRows {
    /// Blocks per row.
    pub blocks: usize,
    /// `[n, blocks]` scales.
    pub d: Vec<f32>,
    /// `[n, blocks · 256]` bytes.
    pub qs: Vec<i8>,
    /// `[n, blocks · 8]` sub-block sums of the bytes.
    pub bsums: Vec<i16>,
}

impl Q8KRows {
    /// Quantize row-major `x: [n, cols]` (each row's last block zero-padded).
    pub fn new(x: &[f32], n: usize, cols: usize) -> Self {
        let blocks = cols.div_ceil(SUPER);
        let mut d = vec![0.0f32; n * blocks];
        let mut qs = vec![0i8; n * blocks * SUPER];
        crate::nn::quant::acts::quantize_rows(x, n, cols, SUPER, &mut d, &mut qs);
        let bsums = qs
            .chunks_exact(SUB)
            .map(|c| c.iter().map(|&v| i16::from(v)).sum())
            .collect();
        Self {
            blocks,
            d,
            qs,
            bsums,
        }
    }

    /// Row `r`'s scales, bytes and sub-block sums.
    pub fn row(&self, r: usize) -> (&[f32], &[i8], &[i16]) {
        let b = self.blocks;
        (
            &self.d[r * b..(r + 1) * b],
            &self.qs[r * b * SUPER..(r + 1) * b * SUPER],
            &self.bsums[r * b * SUBS..(r + 1) * b * SUBS],
        )
    }
}

/// One output of the rule: slot `j` of a group's super-blocks `w` against one activation row.
pub fn dot_row(w: &[GroupQ4K], j: usize, (xd, xq, xs): (&[f32], &[i8], &[i16])) -> f32 {
    let mut acc = 0.0f32;
    for (b, block) in w.iter().enumerate() {
        let (sc, m) = unpack(&block.scales_of(j));
        let qs = block.nibbles_of(j);
        let x = &xq[b * SUPER..(b + 1) * SUPER];
        let mut isum = 0i32;
        for s in 0..SUBS {
            let part: i32 = (0..SUB)
                .map(|k| i32::from(nibble(&qs, s * SUB + k)) * i32::from(x[s * SUB + k]))
                .sum();
            isum += i32::from(sc[s]) * part;
        }
        let msum: i32 = (0..SUBS)
            .map(|s| i32::from(m[s]) * i32::from(xs[b * SUBS + s]))
            .sum();
        acc = (isum as f32).mul_add(block.d[j].to_f32() * xd[b], acc);
        acc = (-(msum as f32)).mul_add(block.dmin[j].to_f32() * xd[b], acc);
    }
    acc
}
