//! 6-bit weights: [`Q6KMatrix`] keeps `W: [out, in]` as GGUF's Q6_K super-blocks (256 weights
//! in 210 bytes: 6.56 bits a weight; the output head and half the value and down maps of a
//! Q4_K_M file), groups of 8 rows interleaved super-block by super-block, and multiplies f32
//! activations by it, the activations quantized per row and 256-value block. The format and the
//! arithmetic every kernel follows are in `rule.rs`; the bodies in `zmm.rs` (AVX-512 VNNI, two
//! groups a vector) and `x86.rs` (256-bit, for AVX-VNNI and AVX2).

use super::rule::GROUP;
use super::{Blocks, QuantKernel, group_with, widen};
use crate::view::Floats;

pub mod rule;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod zmm;

pub use rule::{BLOCK_BYTES, GroupQ6K, Q6KRows, RowQ6K, SUB, SUPER};

/// `W: [rows, cols]` as Q6_K super-blocks in groups of 8 rows (see `rule.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct Q6KMatrix {
    rows: usize,
    cols: usize,
    /// Super-blocks per row (`⌈cols / 256⌉`).
    blocks: usize,
    /// `[⌈rows / 8⌉, blocks]` group super-blocks.
    data: Vec<GroupQ6K>,
}

impl Q6KMatrix {
    /// Quantize row-major `w: [rows, cols]` (any float dtype; a row's last super-block
    /// zero-padded) by [`rule::quantize_super`]. `None` when `w.len() != rows · cols`, a weight
    /// is not finite, or a factor does not fit an f16.
    pub fn quantize(w: Floats<'_>, rows: usize, cols: usize) -> Option<Self> {
        if rows.checked_mul(cols) != Some(w.len()) {
            return None;
        }
        let mut m = Self::zeros(rows, cols);
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
            for b in 0..m.blocks {
                let x = &row[(b * SUPER).min(cols)..((b + 1) * SUPER).min(cols)];
                let q = rule::quantize_super(x)?;
                m.block_mut(o, b).set_row(o % GROUP, &q);
            }
        }
        Some(m)
    }

    /// The matrix a GGUF file stores as `Q6_K`: `rows` rows of `cols / 256` blocks of
    /// [`BLOCK_BYTES`] bytes, row-major, as read from the file (regrouped, not widened).
    /// `None` when `cols` is not a multiple of 256, `bytes` is not that long, or a factor is
    /// not finite.
    pub fn from_gguf(bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        if !cols.is_multiple_of(SUPER)
            || rows.checked_mul(cols / SUPER * BLOCK_BYTES) != Some(bytes.len())
        {
            return None;
        }
        let mut m = Self::zeros(rows, cols);
        for (i, raw) in bytes.chunks_exact(BLOCK_BYTES).enumerate() {
            let (o, b) = (i / m.blocks, i % m.blocks);
            let row = RowQ6K::from_bytes(raw)?;
            if !row.d.is_finite() {
                return None;
            }
            m.block_mut(o, b).set_row(o % GROUP, &row);
        }
        Some(m)
    }

    /// The rows as a GGUF file stores them (every row's super-blocks in order).
    pub fn to_gguf(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.rows * self.blocks * BLOCK_BYTES);
        for o in 0..self.rows {
            for b in 0..self.blocks {
                let block = &self.data[(o / GROUP) * self.blocks + b];
                out.extend(block.row(o % GROUP).to_bytes());
            }
        }
        out
    }

    /// Zero blocks for `[rows, cols]`.
    fn zeros(rows: usize, cols: usize) -> Self {
        let blocks = cols.div_ceil(SUPER);
        Self {
            rows,
            cols,
            blocks,
            data: crate::cpu::pages::streamed_vec(rows.div_ceil(GROUP) * blocks),
        }
    }

    /// Row `o`'s group super-block `b`.
    fn block_mut(&mut self, o: usize, b: usize) -> &mut GroupQ6K {
        &mut self.data[(o / GROUP) * self.blocks + b]
    }

    /// Output rows (`out`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns (`in`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of the super-blocks (210 per 256 weights; a last group of fewer than 8 rows and a
    /// row's last super-block are padded).
    pub fn bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<GroupQ6K>()
    }

    /// The row-major matrix the super-blocks hold, as `f32` (`(d · sc) · (q − 32)`).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.cols];
        for (o, row) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            let g = o / GROUP;
            for (b, chunk) in row.chunks_mut(SUPER).enumerate() {
                rule::dequantize_row(&self.data[g * self.blocks + b], o % GROUP, chunk);
            }
        }
        out
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

impl Blocks for Q6KMatrix {
    type Acts = Q6KRows;

    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    fn bytes(&self) -> usize {
        Q6KMatrix::bytes(self)
    }

    fn acts(x: &[f32], n: usize, cols: usize) -> Q6KRows {
        Q6KRows::new(x, n, cols)
    }

    fn run(&self, kernel: QuantKernel, q: &Q6KRows, n: usize, o0: usize, out: &mut [f32]) {
        let (w, b) = (&self.data, self.blocks);
        // SAFETY (each x86 body): `group_with` runs only a kernel whose extensions were
        // detected; `o0` is a multiple of 8 (a task's first row), the weight holds every group
        // of `rows` and `q` `n` rows of `blocks` blocks (same `cols`).
        #[cfg(target_arch = "x86_64")]
        let op = crate::nn::quant::simd::Operands::new(w, b, q, n, o0, out.len());
        match kernel {
            #[cfg(target_arch = "x86_64")]
            QuantKernel::Avx512Vnni => unsafe { zmm::matmul_rows(&op, n, out) },
            #[cfg(target_arch = "x86_64")]
            QuantKernel::AvxVnni => unsafe { x86::matmul_rows_avxvnni(&op, n, out) },
            #[cfg(target_arch = "x86_64")]
            QuantKernel::Avx2 => unsafe { x86::matmul_rows_avx2(&op, n, out) },
            _ => rule::matmul_rows(w, b, q, n, o0, out),
        }
    }
}

/// One product of a Q6_K group: the weight and its bias (`rows` values), if any.
pub type Q6KPart<'a> = (&'a Q6KMatrix, Option<&'a [f32]>);

/// [`super::matmul_group`] for Q6_K weights: the activations quantized once, every part's
/// outputs in one pool dispatch, each the bits of its own [`Q6KMatrix::matmul`].
pub fn matmul_group(parts: &[Q6KPart<'_>], x: &[f32], n: usize) -> Option<Vec<Vec<f32>>> {
    group_with(QuantKernel::best(), parts, x, n)
}

#[cfg(test)]
mod tests;
