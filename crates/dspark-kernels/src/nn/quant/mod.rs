//! Quantized weights, as GGUF stores them, multiplied by f32 activations quantized per row and
//! block:
//! - [`QuantMatrix`]: Q8_0, blocks of 32 weights with one f16 scale (34 bytes, 1.0625 bytes a
//!   weight); the rule every kernel follows is in `rule.rs`;
//! - [`q4k::Q4KMatrix`]: Q4_K, super-blocks of 256 weights in 8 sub-blocks of 32, 4-bit weights
//!   with 6-bit scales and mins (144 bytes, 0.5625 bytes a weight);
//! - [`q6k::Q6KMatrix`]: Q6_K, super-blocks of 256 weights in 16 sub-blocks of 16, 6-bit weights
//!   with 8-bit scales (210 bytes, 0.82 bytes a weight), as a GGUF file's Q4_K_M mix has them.
//!
//! All keep groups of 8 rows interleaved block by block, their bytes 4 at a time across the
//! rows, and each row's activations are quantized on their own (`acts.rs`), so a row's result
//! does not depend on the other rows of the call. Each format has four bodies with the same
//! bits ([`QuantKernel`]): AVX-512 VNNI on two groups at once (`zmm.rs`), VNNI on one
//! (`vnni.rs`, AVX-VNNI's and the odd group's), AVX2 (`x86.rs`) and the portable rule; their
//! shared pieces are in `simd.rs`.
//!
//! A decode step on a CPU is bound by the bytes it reads: a Q8_0 weight reads about half a bf16
//! one's, a Q4_K weight about a quarter. A product reads each weight block once for all its rows
//! (a verification's 9 rows included) and splits the outputs over the pool for large weights, as
//! the panel kernel does ([`crate::threads::split_stream`]).

use crate::view::Floats;

mod acts;
mod group;
pub mod q4k;
pub mod q6k;
pub mod rule;
#[cfg(target_arch = "x86_64")]
mod simd;
pub mod superblock;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod zmm;

pub use group::{AnyQuant, matmul_mixed};
pub(crate) use group::{Blocks, Bodies, group_with};
pub use rule::{BLOCK, GROUP, GroupQ8, QuantRows};

/// A quantized format for weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quant {
    /// Blocks of 32 weights with one f16 scale (8.5 bits a weight).
    Q8_0,
    /// Super-blocks of 256 weights: 4-bit weights, 6-bit scales and mins per 32, two f16
    /// super-scales (4.5 bits a weight).
    Q4K,
    /// Super-blocks of 256 weights: 6-bit weights, 8-bit scales per 16, one f16 super-scale
    /// (6.56 bits a weight). Read from GGUF files (a Q4_K_M file's head and part of its value
    /// and down maps); not a load-time format ([`Quant::parse`] does not take it).
    Q6K,
}

/// The names [`Quant::parse`] takes, for messages.
pub const QUANT_NAMES: &str = "q8_0, q4_k";

impl Quant {
    /// Its name (`q8_0`, `q4_k`, `q6_k`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Q8_0 => "q8_0",
            Self::Q4K => "q4_k",
            Self::Q6K => "q6_k",
        }
    }

    /// The format named `value` (`q8_0`, `q4_k`, any case), if it is one.
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "q8_0" | "q8" => Some(Self::Q8_0),
            "q4_k" | "q4k" => Some(Self::Q4K),
            _ => None,
        }
    }

    /// The format of a model's output head when its layers are in this one: Q8_0 for both (the
    /// head decides every token and is read once a step, so it keeps 8 bits, as llama.cpp's
    /// Q4_K_M keeps its output at 6).
    pub fn head(self) -> Self {
        Self::Q8_0
    }
}

/// Which body runs a product (all give the same bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantKernel {
    /// AVX-512 VNNI (with F, VL and BW), FMA and F16C: one 512-bit `vpdpbusd` per 4 bytes
    /// of two groups' 16 rows.
    Avx512Vnni,
    /// AVX-VNNI (the VEX form of the same instruction), AVX2, FMA and F16C.
    AvxVnni,
    /// AVX2 + FMA + F16C: `vpmaddubsw` and `vpmaddwd`.
    Avx2,
    /// Plain Rust.
    Portable,
}

impl QuantKernel {
    /// Every body, fastest first.
    pub const ALL: [Self; 4] = [Self::Avx512Vnni, Self::AvxVnni, Self::Avx2, Self::Portable];

    /// Its name (`avx512vnni`, `avxvnni`, `avx2`, `portable`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Avx512Vnni => "avx512vnni",
            Self::AvxVnni => "avxvnni",
            Self::Avx2 => "avx2",
            Self::Portable => "portable",
        }
    }

    /// Whether this CPU runs it.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = crate::cpu::has_avx2() && has!("f16c");
            match self {
                Self::Avx512Vnni => {
                    avx2 && has!("avx512f")
                        && has!("avx512vl")
                        && has!("avx512bw")
                        && has!("avx512vnni")
                }
                Self::AvxVnni => avx2 && has!("avxvnni"),
                Self::Avx2 => avx2,
                Self::Portable => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Self::Portable
        }
    }

    /// Every body this CPU runs, fastest first (the portable one last).
    pub fn runnable() -> impl Iterator<Item = Self> {
        Self::ALL.into_iter().filter(|k| k.available())
    }

    /// The fastest body this CPU runs.
    pub fn best() -> Self {
        static BEST: std::sync::OnceLock<QuantKernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| Self::runnable().next().unwrap_or(Self::Portable))
    }
}

/// `dst[i] = f32(src[i])` (exact for bf16 and f16).
pub(crate) fn widen<T: Copy + Into<f32>>(src: &[T], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s.into();
    }
}

/// `W: [rows, cols]` as Q8_0 blocks in groups of 8 rows (see `rule.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantMatrix {
    rows: usize,
    cols: usize,
    /// Blocks per row (`⌈cols / 32⌉`).
    blocks: usize,
    /// `[⌈rows / 8⌉, blocks]` group-blocks.
    data: Vec<GroupQ8>,
}

impl QuantMatrix {
    /// Quantize row-major `w: [rows, cols]` (any float dtype). `None` when `w.len() != rows ·
    /// cols`, a weight is not finite, or a block's scale does not fit an f16 (a weight above
    /// 65504 · 127 in size).
    pub fn quantize(w: Floats<'_>, rows: usize, cols: usize) -> Option<Self> {
        if rows.checked_mul(cols) != Some(w.len()) {
            return None;
        }
        let blocks = cols.div_ceil(BLOCK);
        let mut data = crate::cpu::pages::streamed_vec(rows.div_ceil(GROUP) * blocks);
        let mut row = vec![0.0f32; cols];
        for o in 0..rows {
            let at = o * cols;
            match w {
                Floats::F32(s) => row.copy_from_slice(&s[at..at + cols]),
                Floats::BF16(s) => widen(&s[at..at + cols], &mut row),
                Floats::F16(s) => widen(&s[at..at + cols], &mut row),
            }
            if !row.iter().all(|v| v.is_finite()) {
                return None;
            }
            let g = o / GROUP;
            rule::quantize_weight_row(&row, o % GROUP, &mut data[g * blocks..(g + 1) * blocks]);
        }
        data.iter()
            .all(|b: &GroupQ8| b.d.iter().all(|d| d.is_finite()))
            .then_some(Self {
                rows,
                cols,
                blocks,
                data,
            })
    }

    /// The matrix a GGUF file stores as `Q8_0`: `rows` rows of `cols / 32` blocks of 34 bytes
    /// (an f16 scale, then 32 signed bytes), row-major, as read from the file (regrouped, not
    /// widened). `None` when `cols` is not a multiple of 32, `bytes` is not that long, or a
    /// scale is not finite.
    pub fn from_gguf(bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        const RAW: usize = 2 + BLOCK;
        if !cols.is_multiple_of(BLOCK) || rows.checked_mul(cols / BLOCK * RAW) != Some(bytes.len())
        {
            return None;
        }
        let blocks = cols / BLOCK;
        let mut data: Vec<GroupQ8> = crate::cpu::pages::streamed_vec(rows.div_ceil(GROUP) * blocks);
        for (i, raw) in bytes.chunks_exact(RAW).enumerate() {
            let (o, b) = (i / blocks, i % blocks);
            let d = half::f16::from_le_bytes([raw[0], raw[1]]);
            if !d.is_finite() {
                return None;
            }
            let block = &mut data[(o / GROUP) * blocks + b];
            block.d[o % GROUP] = d;
            block.set_row(o % GROUP, &std::array::from_fn(|i| raw[2 + i] as i8));
        }
        Some(Self {
            rows,
            cols,
            blocks,
            data,
        })
    }

    /// The rows as a GGUF file stores them (every row's blocks in order: [`Self::from_gguf`]'s
    /// input).
    pub fn to_gguf(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.rows * self.blocks * (2 + BLOCK));
        for o in 0..self.rows {
            for block in &self.data[(o / GROUP) * self.blocks..][..self.blocks] {
                out.extend(block.d[o % GROUP].to_le_bytes());
                out.extend(block.row(o % GROUP).map(|q| q as u8));
            }
        }
        out
    }

    /// Output rows (`out`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns (`in`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of the blocks (34 per 32 weights; a last group of fewer than 8 rows is padded).
    pub fn bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<GroupQ8>()
    }

    /// The row-major matrix the blocks hold, as `f32` (`d · q`).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.cols];
        for (o, row) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            self.row_into(o, row);
        }
        out
    }

    /// Row `o`'s `cols` values (as [`Self::dequantize`] gives them) into `out`. Panics when
    /// `o >= rows` or `out` is not `cols` long.
    pub fn row_into(&self, o: usize, out: &mut [f32]) {
        assert!(
            o < self.rows && out.len() == self.cols,
            "row {o} of {}",
            self.rows
        );
        let (g, j) = (o / GROUP, o % GROUP);
        let group = &self.data[g * self.blocks..][..self.blocks];
        for (block, chunk) in group.iter().zip(out.chunks_mut(BLOCK)) {
            let d = block.d[j].to_f32();
            for (v, q) in chunk.iter_mut().zip(block.row(j)) {
                *v = d * f32::from(q);
            }
        }
    }

    /// `y = x · Wᵀ (+ bias)` for row-major `x: [n, cols]`, with the fastest body: row-major
    /// `[n, rows]`. `None` when `x.len() != n · cols` or a bias is not `rows` long.
    pub fn matmul(&self, x: &[f32], n: usize, bias: Option<&[f32]>) -> Option<Vec<f32>> {
        self.matmul_with(QuantKernel::best(), x, n, bias)
    }

    /// [`Self::matmul`] with `kernel` (the portable one where AVX2 is missing).
    pub fn matmul_with(
        &self,
        kernel: QuantKernel,
        x: &[f32],
        n: usize,
        bias: Option<&[f32]>,
    ) -> Option<Vec<f32>> {
        group_with(kernel, &[(self, bias)], x, n)?.pop()
    }
}

/// One product of a group: the weight and its bias (`rows` values), if any.
pub type QuantPart<'a> = (&'a QuantMatrix, Option<&'a [f32]>);

/// `y_i = x · W_iᵀ (+ bias_i)` for each part, with the fastest body: the activations quantized
/// once and every part's outputs in one pool dispatch (a layer's q, k and v projections, its
/// gate and up), each the bits of its own [`QuantMatrix::matmul`]. `None` when a part's width
/// is not `x`'s (`x.len() != n · cols`) or a bias is not its `rows` long.
pub fn matmul_group(parts: &[QuantPart<'_>], x: &[f32], n: usize) -> Option<Vec<Vec<f32>>> {
    group_with(QuantKernel::best(), parts, x, n)
}

/// The Q8_0 product's bodies.
pub(crate) const Q8_BODIES: Bodies<GroupQ8, QuantRows> = Bodies {
    dot: |w, j, x, r| {
        let (xd, xq, _) = x.row(r);
        rule::dot_row(w, j, xd, xq)
    },
    #[cfg(target_arch = "x86_64")]
    x86: [
        zmm::matmul_rows,
        vnni::matmul_rows_avxvnni,
        x86::matmul_rows,
    ],
};

impl Blocks for QuantMatrix {
    type Acts = QuantRows;

    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    fn bytes(&self) -> usize {
        QuantMatrix::bytes(self)
    }

    fn acts(x: &[f32], n: usize, cols: usize) -> QuantRows {
        QuantRows::new(x, n, cols)
    }

    fn run(&self, kernel: QuantKernel, q: &QuantRows, n: usize, o0: usize, out: &mut [f32]) {
        Q8_BODIES.run(kernel, &self.data, self.blocks, q, n, o0, out);
    }
}

#[cfg(test)]
mod tests;
