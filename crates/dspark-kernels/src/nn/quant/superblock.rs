//! What every block format shares: a matrix of blocks in groups of 8 rows ([`SuperMatrix`]),
//! generic over the group block ([`SuperGroup`]: Q8_0's 32-weight [`super::GroupQ8`], Q4_K's
//! and Q6_K's 256-weight super-blocks [`super::q4k::GroupQ4K`] and [`super::q6k::GroupQ6K`]):
//! quantizing, GGUF's rows read and written, dequantizing, rows looked up, and the product
//! through the group dispatch ([`Blocks`]).

use rayon::prelude::*;

use super::group::Bodies;
use super::rule::GROUP;
use super::{Blocks, QuantKernel, group_with, widen};
use crate::view::Floats;

/// Weights per K-quant super-block.
pub const SUPER: usize = 256;

/// One block of a group of [`GROUP`] rows in a block format.
pub trait SuperGroup: Copy + Default + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    /// Weights of one row's block (32 for Q8_0, [`SUPER`] for the K-quants).
    const WEIGHTS: usize;

    /// Bytes of one row's block in a GGUF file.
    const RAW: usize;

    /// The activations the product reads, quantized per row.
    type Acts: Sync;

    /// Quantize row `j`'s block `x` (at most [`Self::WEIGHTS`] finite values; missing ones count
    /// as 0) into this group block. `None` when a factor does not fit an f16.
    fn quantize(&mut self, j: usize, x: &[f32]) -> Option<()>;

    /// Set row `j` from a GGUF file's [`Self::RAW`] bytes. `None` when a factor is not finite.
    fn read(&mut self, j: usize, raw: &[u8]) -> Option<()>;

    /// Append row `j`'s block as a GGUF file stores it.
    fn write(&self, j: usize, out: &mut Vec<u8>);

    /// Row `j`'s first `out.len()` weights as `f32`.
    fn dequantize(&self, j: usize, out: &mut [f32]);

    /// Row-major `x: [n, cols]` quantized per row.
    fn acts(x: &[f32], n: usize, cols: usize) -> Self::Acts;

    /// The product's bodies.
    const BODIES: Bodies<Self, Self::Acts>;
}

/// `W: [rows, cols]` as blocks `G` in groups of 8 rows.
#[derive(Debug, Clone, PartialEq)]
pub struct SuperMatrix<G> {
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Blocks per row (`⌈cols / G::WEIGHTS⌉`).
    pub(super) blocks: usize,
    /// `[⌈rows / 8⌉, blocks]` group blocks.
    pub(super) data: Vec<G>,
}

impl<G: SuperGroup> SuperMatrix<G> {
    /// Quantize row-major `w: [rows, cols]` (any float dtype; a row's last block
    /// zero-padded). `None` when `w.len() != rows · cols`, a weight is not finite, or a factor
    /// does not fit an f16.
    pub fn quantize(w: Floats<'_>, rows: usize, cols: usize) -> Option<Self> {
        if rows.checked_mul(cols) != Some(w.len()) {
            return None;
        }
        let mut m = Self::zeros(rows, cols);
        let blocks = m.blocks;
        // Each group of rows on its own over the pool (Q4_K's scale search is the costliest
        // part of loading a checkpoint in place: see `q4k/search.rs`).
        let quantize_group = |(g, group): (usize, &mut [G])| -> Option<()> {
            let mut row = vec![0.0f32; cols];
            for o in g * GROUP..((g + 1) * GROUP).min(rows) {
                let at = o * cols;
                match w {
                    Floats::F32(s) => row.copy_from_slice(&s[at..at + cols]),
                    Floats::BF16(s) => widen(&s[at..at + cols], &mut row),
                    Floats::F16(s) => widen(&s[at..at + cols], &mut row),
                }
                if !row.iter().all(|v| v.is_finite()) {
                    return None;
                }
                for (b, block) in group.iter_mut().enumerate() {
                    let x = &row[(b * G::WEIGHTS).min(cols)..((b + 1) * G::WEIGHTS).min(cols)];
                    block.quantize(o % GROUP, x)?;
                }
            }
            Some(())
        };
        if blocks > 0 {
            m.data
                .par_chunks_mut(blocks)
                .enumerate()
                .try_for_each(quantize_group)?;
        }
        Some(m)
    }

    /// The matrix a GGUF file stores: `rows` rows of `cols / G::WEIGHTS` blocks of
    /// [`SuperGroup::RAW`] bytes, row-major, as read from the file (regrouped, not widened).
    /// `None` when `cols` is not a multiple of a block, `bytes` is not that long, or a factor is
    /// not finite.
    pub fn from_gguf(bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        if !cols.is_multiple_of(G::WEIGHTS)
            || rows.checked_mul(cols / G::WEIGHTS * G::RAW) != Some(bytes.len())
        {
            return None;
        }
        let mut m = Self::zeros(rows, cols);
        for (i, raw) in bytes.chunks_exact(G::RAW).enumerate() {
            let (o, b) = (i / m.blocks, i % m.blocks);
            m.block_mut(o, b).read(o % GROUP, raw)?;
        }
        Some(m)
    }

    /// The rows as a GGUF file stores them (every row's blocks in order:
    /// [`Self::from_gguf`]'s input).
    pub fn to_gguf(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.rows * self.blocks * G::RAW);
        for o in 0..self.rows {
            for block in &self.data[(o / GROUP) * self.blocks..][..self.blocks] {
                block.write(o % GROUP, &mut out);
            }
        }
        out
    }

    /// Zero blocks for `[rows, cols]` (each format's default: weights of 0).
    pub(super) fn zeros(rows: usize, cols: usize) -> Self {
        let blocks = cols.div_ceil(G::WEIGHTS);
        Self {
            rows,
            cols,
            blocks,
            data: crate::cpu::pages::streamed_vec(rows.div_ceil(GROUP) * blocks),
        }
    }

    /// Row `o`'s group block `b`.
    pub(super) fn block_mut(&mut self, o: usize, b: usize) -> &mut G {
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

    /// Bytes of the blocks (a last group of fewer than 8 rows and a row's last block are
    /// padded).
    pub fn bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<G>()
    }

    /// The row-major matrix the blocks hold, as `f32`.
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
        let group = &self.data[(o / GROUP) * self.blocks..][..self.blocks];
        for (block, chunk) in group.iter().zip(out.chunks_mut(G::WEIGHTS)) {
            block.dequantize(o % GROUP, chunk);
        }
    }

    /// `y = x · Wᵀ (+ bias)` for row-major `x: [n, cols]`, with the fastest body: row-major
    /// `[n, rows]`. `None` when `x.len() != n · cols` or a bias is not `rows` long.
    pub fn matmul(&self, x: &[f32], n: usize, bias: Option<&[f32]>) -> Option<Vec<f32>> {
        self.matmul_with(QuantKernel::best(), x, n, bias)
    }

    /// [`Self::matmul`] with `kernel` (the portable one where this CPU lacks it).
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

impl<G: SuperGroup> Blocks for SuperMatrix<G> {
    type Acts = G::Acts;

    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    fn bytes(&self) -> usize {
        SuperMatrix::bytes(self)
    }

    fn acts(x: &[f32], n: usize, cols: usize) -> G::Acts {
        G::acts(x, n, cols)
    }

    fn run(&self, kernel: QuantKernel, q: &G::Acts, n: usize, o0: usize, out: &mut [f32]) {
        G::BODIES.run(kernel, &self.data, self.blocks, q, n, o0, out);
    }
}

/// [`super::matmul_group`] for one K-quant format: the activations quantized once, every
/// part's outputs in one pool dispatch, each the bits of its own [`SuperMatrix::matmul`].
pub fn matmul_group<G: SuperGroup>(
    parts: &[(&SuperMatrix<G>, Option<&[f32]>)],
    x: &[f32],
    n: usize,
) -> Option<Vec<Vec<f32>>> {
    group_with(QuantKernel::best(), parts, x, n)
}
