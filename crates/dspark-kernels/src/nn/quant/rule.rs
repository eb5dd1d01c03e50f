//! The Q8_0 rule: how a block is quantized, and the arithmetic of a product, which every kernel
//! follows to the bit (this file is the portable kernel and the reference the x86 one is tested
//! against).
//!
//! **Blocks.** 32 consecutive values of a row become one scale and 32 signed bytes:
//! `d = max|x| / 127` (f32), `q_i = round(x_i / d)` (half away from zero), each in
//! `[-127, 127]`; an all-zero block has `d = 0` and zero bytes. A weight block stores `d` as f16
//! (34 bytes a block, the layout GGUF's Q8_0 uses); an activation block keeps it as f32.
//!
//! **Products.** `y[r][o] = Σ_b s_b · Σ_i qw_i · qx_i` over the blocks `b` of row `o` of `W`
//! and row `r` of `x`, with `s_b = f32(d_w) · d_x` rounded once. The integer sum of a block is
//! exact (in any order); the float sum runs over the blocks in order, one fused multiply-add
//! each: `acc = fma(f32(isum_b), s_b, acc)` from `0.0`, then `+ bias`. Each row's activations
//! are quantized on their own, so a row's result never depends on the other rows of the call:
//! a 9-row verification gives each row the bits of a 1-row decode step.
//!
//! **Layout.** Rows are stored in groups of [`GROUP`] (the last one zero-padded): for each group
//! and block, the group's 8 scales side by side, then its 8 rows' 32 bytes ([`GroupQ8`], 272
//! bytes: 34 per row-block, as in GGUF), interleaved 4 bytes at a time ([`quad_at`]): bytes
//! `4k .. 4k + 4` of the 8 rows make one 32-byte word. A kernel reads one group-block per step
//! and widens its 8 scales in one instruction; each word against 4 activation bytes (broadcast)
//! adds one partial dot product per row, lane `j` row `j`'s, so its 8 sums land in one vector
//! with no horizontal adds.

use half::f16;

/// Values per block.
pub const BLOCK: usize = 32;

/// Output rows per group.
pub const GROUP: usize = 8;

/// Where byte `i` of row `j` of a group sits among the group's interleaved bytes: the rows'
/// bytes `4k .. 4k + 4` side by side, row after row, for `k = 0, 1, …` (Q8_0's 32 bytes a row
/// and Q4_K's 128 nibble bytes and 12 scale bytes alike).
#[inline]
pub const fn quad_at(j: usize, i: usize) -> usize {
    (i / 4) * (4 * GROUP) + j * 4 + i % 4
}

/// One block of a group of [`GROUP`] rows: their scales (`max|x| / 127` in f16), then their
/// bytes (`round(x_i / d)`), interleaved ([`quad_at`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct GroupQ8 {
    /// Row `j`'s scale.
    pub d: [f16; GROUP],
    /// The rows' bytes: byte `i` of row `j` at [`quad_at`]`(j, i)`.
    pub qs: [i8; GROUP * BLOCK],
}

impl Default for GroupQ8 {
    fn default() -> Self {
        Self {
            d: [f16::ZERO; GROUP],
            qs: [0; GROUP * BLOCK],
        }
    }
}

impl GroupQ8 {
    /// Row `j`'s 32 bytes, in order.
    pub fn row(&self, j: usize) -> [i8; BLOCK] {
        std::array::from_fn(|i| self.qs[quad_at(j, i)])
    }

    /// Set row `j`'s 32 bytes.
    pub fn set_row(&mut self, j: usize, q: &[i8; BLOCK]) {
        for (i, &v) in q.iter().enumerate() {
            self.qs[quad_at(j, i)] = v;
        }
    }
}

/// The scale of `x` (at most `q.len()` values; missing ones count as 0) and its bytes, into `q`
/// (a Q8_0 block's 32, a Q4_K activation block's 256).
pub fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (i, slot) in q.iter_mut().enumerate() {
        *slot = level(x.get(i).copied().unwrap_or(0.0) * id);
    }
    d
}

/// `v` rounded half away from zero (as [`f32::round`]) and clamped to `[-127, 127]`; NaN gives
/// 0. Without libm (`roundf` is a call where SSE4.1 is not assumed): the truncation and the
/// fraction `v − trunc(v)` are exact, and the fraction decides. `acts.rs`'s AVX2 body does the
/// same per lane.
#[inline]
pub fn level(v: f32) -> i8 {
    let v = v.clamp(-128.0, 128.0);
    let t = v as i32;
    let f = v - t as f32;
    let r = t + i32::from(f >= 0.5) - i32::from(f <= -0.5);
    r.clamp(-127, 127) as i8
}

/// One output of the rule: slot `j` of a group's blocks `w` against one activation row (`xd`,
/// `xq`).
pub fn dot_row(w: &[GroupQ8], j: usize, xd: &[f32], xq: &[i8]) -> f32 {
    let mut acc = 0.0f32;
    for (b, block) in w.iter().enumerate() {
        let x = &xq[b * BLOCK..(b + 1) * BLOCK];
        let isum: i32 = block
            .row(j)
            .iter()
            .zip(x)
            .map(|(&a, &c)| i32::from(a) * i32::from(c))
            .sum();
        let s = block.d[j].to_f32() * xd[b];
        acc = (isum as f32).mul_add(s, acc);
    }
    acc
}
