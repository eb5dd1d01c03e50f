//! The Q6_K rule: the format (GGUF's `block_q6_K`), how dspark quantizes a super-block, and the
//! arithmetic of a product, which every kernel follows to the bit (this file is the portable
//! kernel and the reference the x86 body is tested against).
//!
//! **Super-blocks.** 256 consecutive weights of a row, in 16 sub-blocks of 16. Sub-block `s`
//! has a signed 8-bit scale `sc_s`; the super-block one f16 factor `d`; each weight a 6-bit `q`
//! in `0..=63`. The weight is `(d · sc_s) · (q − 32)`. Stored as GGUF stores it (210 bytes):
//! 128 bytes of low nibbles (`ql`), 64 bytes of high bit pairs (`qh`), the 16 scales, then `d`.
//! Weight `i = 128h + 32p + l` (half `h`, part `p` in `0..4`, `l` in `0..32`) has its low 4 bits
//! in nibble `p / 2` of `ql[64h + 32(p % 2) + l]` and its high 2 bits at bit `2p` of
//! `qh[32h + l]` ([`level`]).
//!
//! **Activations.** Each row's 256-value blocks are quantized as Q4_K's are ([`Q8KRows`]), and
//! each 16-value sub-block's byte sum, times 32, is kept beside them ([`Q6KRows::off`]).
//!
//! **Products.** Per super-block `b` of row `o` of `W` and row `r` of `x`, one exact integer sum
//! `isum = Σ_s sc_s · (Σ_i q_i · x_i − 32 · Σ_i x_i)`; then, over the super-blocks in order from
//! `0.0`, `acc = fma(f32(isum), f32(d) · d_x, acc)`, the product of scales rounded once; then
//! `+ bias`. A row's result never depends on the other rows of the call.
//!
//! **Layout.** Rows are stored in groups of [`GROUP`] (the last one zero-padded; a row's last
//! super-block too, at level 32, weight 0): for each group and super-block, the 8 rows' `d`,
//! their scales, their `ql` bytes, then their `qh` bytes ([`GroupQ6K`], 8 × 210 bytes), every
//! byte array interleaved 4 at a time across the rows ([`quad_at`]), so one 32-byte load holds
//! the same 4 bytes of every row.

use half::f16;

use super::super::q4k::rule::Q8KRows;
use super::super::rule::{GROUP, quad_at};

/// Weights per super-block.
pub const SUPER: usize = 256;

/// Weights per sub-block.
pub const SUB: usize = 16;

/// Sub-blocks per super-block.
pub const SUBS: usize = SUPER / SUB;

/// Bytes of one row's super-block in a GGUF file (`block_q6_K`).
pub const BLOCK_BYTES: usize = 210;

/// The level of weight 0.
pub const ZERO_LEVEL: u8 = 32;

/// One super-block of a group of [`GROUP`] rows, in GGUF's fields (bytes interleaved across the
/// rows, [`quad_at`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct GroupQ6K {
    /// Row `j`'s scale of its sub-block scales.
    pub d: [f16; GROUP],
    /// The rows' 16 sub-block scales: scale `s` of row `j` at [`quad_at`]`(j, s)`.
    pub scales: [i8; GROUP * SUBS],
    /// The rows' 128 low-nibble bytes: byte `i` of row `j` at [`quad_at`]`(j, i)`.
    pub ql: [u8; GROUP * SUPER / 2],
    /// The rows' 64 high-bit bytes: byte `i` of row `j` at [`quad_at`]`(j, i)`.
    pub qh: [u8; GROUP * SUPER / 4],
}

impl Default for GroupQ6K {
    fn default() -> Self {
        Self {
            d: [f16::ZERO; GROUP],
            scales: [0; GROUP * SUBS],
            // Level 32 everywhere: padding weighs 0 whatever the scales.
            ql: [0; GROUP * SUPER / 2],
            qh: [0xaa; GROUP * SUPER / 4],
        }
    }
}

/// One row's super-block in GGUF's fields.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowQ6K {
    /// Low nibbles.
    pub ql: [u8; SUPER / 2],
    /// High bit pairs.
    pub qh: [u8; SUPER / 4],
    /// Sub-block scales.
    pub scales: [i8; SUBS],
    /// The scale of the scales.
    pub d: f16,
}

impl RowQ6K {
    /// The row as a GGUF file stores it (`None` unless `raw` is [`BLOCK_BYTES`] long).
    pub fn from_bytes(raw: &[u8]) -> Option<Self> {
        if raw.len() != BLOCK_BYTES {
            return None;
        }
        Some(Self {
            ql: raw[..128].try_into().ok()?,
            qh: raw[128..192].try_into().ok()?,
            scales: std::array::from_fn(|s| raw[192 + s] as i8),
            d: f16::from_le_bytes([raw[208], raw[209]]),
        })
    }

    /// The 210 bytes a GGUF file stores.
    pub fn to_bytes(&self) -> [u8; BLOCK_BYTES] {
        let mut out = [0u8; BLOCK_BYTES];
        out[..128].copy_from_slice(&self.ql);
        out[128..192].copy_from_slice(&self.qh);
        for (o, &s) in out[192..208].iter_mut().zip(&self.scales) {
            *o = s as u8;
        }
        out[208..].copy_from_slice(&self.d.to_le_bytes());
        out
    }
}

impl GroupQ6K {
    /// Row `j`'s super-block, in GGUF's order.
    pub fn row(&self, j: usize) -> RowQ6K {
        RowQ6K {
            ql: std::array::from_fn(|i| self.ql[quad_at(j, i)]),
            qh: std::array::from_fn(|i| self.qh[quad_at(j, i)]),
            scales: std::array::from_fn(|s| self.scales[quad_at(j, s)]),
            d: self.d[j],
        }
    }

    /// Set row `j`'s super-block.
    pub fn set_row(&mut self, j: usize, row: &RowQ6K) {
        self.d[j] = row.d;
        for (i, &v) in row.ql.iter().enumerate() {
            self.ql[quad_at(j, i)] = v;
        }
        for (i, &v) in row.qh.iter().enumerate() {
            self.qh[quad_at(j, i)] = v;
        }
        for (s, &v) in row.scales.iter().enumerate() {
            self.scales[quad_at(j, s)] = v;
        }
    }
}

/// Weight `i`'s level (`0..=63`) in a row's super-block (see the module docs).
#[inline]
pub fn level(row: &RowQ6K, i: usize) -> u8 {
    let (h, p, l) = (i / 128, (i % 128) / 32, i % 32);
    let low = (row.ql[64 * h + 32 * (p % 2) + l] >> (4 * (p / 2))) & 15;
    let high = (row.qh[32 * h + l] >> (2 * p)) & 3;
    low | (high << 4)
}

/// Set weight `i`'s level (`0..=63`; the bits it had must be clear).
fn set_level(row: &mut RowQ6K, i: usize, q: u8) {
    let (h, p, l) = (i / 128, (i % 128) / 32, i % 32);
    row.ql[64 * h + 32 * (p % 2) + l] |= (q & 15) << (4 * (p / 2));
    row.qh[32 * h + l] |= (q >> 4) << (2 * p);
}

/// `v` rounded half away from zero (no libm call).
#[inline]
fn round(v: f32) -> i32 {
    (v + 0.5f32.copysign(v)) as i32
}

/// A row's super-block `x` (at most [`SUPER`] values; missing ones count as 0) quantized: each
/// sub-block's step is `max|x| / 31`, the steps' largest is 127 `d`, each sub-block's scale its
/// step in `d`s (rounded), each level `x / (d · sc) + 32` (rounded, clamped to `0..=63`).
/// `None` when `d` does not fit an f16; `x` must be finite.
pub fn quantize_super(x: &[f32]) -> Option<RowQ6K> {
    let mut padded = [0.0f32; SUPER];
    padded[..x.len()].copy_from_slice(x);
    let steps: [f32; SUBS] = std::array::from_fn(|s| {
        padded[s * SUB..][..SUB]
            .iter()
            .fold(0.0f32, |m, v| m.max(v.abs()))
            / 31.0
    });
    let d = f16::from_f32(steps.iter().fold(0.0f32, |m, &v| m.max(v)) / 127.0);
    if !d.is_finite() {
        return None;
    }
    let df = d.to_f32();
    let mut row = RowQ6K {
        ql: [0; SUPER / 2],
        qh: [0; SUPER / 4],
        scales: [0; SUBS],
        d,
    };
    for (s, &step_s) in steps.iter().enumerate() {
        let sc = if df > 0.0 {
            round(step_s / df).clamp(0, 127) as i8
        } else {
            0
        };
        row.scales[s] = sc;
        let step = df * f32::from(sc);
        for (k, &v) in padded[s * SUB..(s + 1) * SUB].iter().enumerate() {
            let q = if step > 0.0 {
                (round(v / step) + i32::from(ZERO_LEVEL)).clamp(0, 63) as u8
            } else {
                ZERO_LEVEL
            };
            set_level(&mut row, s * SUB + k, q);
        }
    }
    Some(row)
}

/// Row `j` of a group super-block as `f32` weights (`(d · sc) · (q − 32)`), into `out` (its
/// first `out.len()` weights).
pub fn dequantize_row(block: &GroupQ6K, j: usize, out: &mut [f32]) {
    let row = block.row(j);
    let d = row.d.to_f32();
    for (i, w) in out.iter_mut().enumerate() {
        let q = i32::from(level(&row, i)) - i32::from(ZERO_LEVEL);
        *w = d * f32::from(row.scales[i / SUB]) * q as f32;
    }
}

/// Activations for Q6_K: [`Q8KRows`] and, per row, block and 16-value sub-block, 32 times the
/// sub-block's byte sum.
#[derive(Debug, Clone, PartialEq)]
pub struct Q6KRows {
    /// The quantized rows.
    pub x: Q8KRows,
    /// `[n, blocks · 16]`: `32 · Σ` of each sub-block's bytes.
    pub off: Vec<i32>,
}

impl Q6KRows {
    /// Quantize row-major `x: [n, cols]` (each row's last block zero-padded).
    pub fn new(x: &[f32], n: usize, cols: usize) -> Self {
        let x = Q8KRows::new(x, n, cols);
        let off =
            x.qs.chunks_exact(SUB)
                .map(|c| 32 * c.iter().map(|&v| i32::from(v)).sum::<i32>())
                .collect();
        Self { x, off }
    }

    /// Row `r`'s scales, bytes and sub-block offsets.
    pub fn row(&self, r: usize) -> (&[f32], &[i8], &[i32]) {
        let b = self.x.blocks;
        let (d, qs, _) = self.x.row(r);
        (d, qs, &self.off[r * b * SUBS..(r + 1) * b * SUBS])
    }
}

/// One output of the rule: slot `j` of a group's super-blocks `w` against one activation row.
pub fn dot_row(w: &[GroupQ6K], j: usize, (xd, xq, off): (&[f32], &[i8], &[i32])) -> f32 {
    let mut acc = 0.0f32;
    for (b, block) in w.iter().enumerate() {
        let row = block.row(j);
        let x = &xq[b * SUPER..(b + 1) * SUPER];
        let mut isum = 0i32;
        for s in 0..SUBS {
            let part: i32 = (s * SUB..(s + 1) * SUB)
                .map(|i| i32::from(level(&row, i)) * i32::from(x[i]))
                .sum();
            isum += i32::from(row.scales[s]) * (part - off[b * SUBS + s]);
        }
        acc = (isum as f32).mul_add(row.d.to_f32() * xd[b], acc);
    }
    acc
}
