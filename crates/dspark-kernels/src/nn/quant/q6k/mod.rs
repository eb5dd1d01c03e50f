//! 6-bit weights: [`Q6KMatrix`] keeps `W: [out, in]` as GGUF's Q6_K super-blocks (256 weights
//! in 210 bytes: 6.56 bits a weight; the output head and half the value and down maps of a
//! Q4_K_M file), groups of 8 rows interleaved super-block by super-block, and multiplies f32
//! activations by it, the activations quantized per row and 256-value block. The format and the
//! arithmetic every kernel follows are in `rule.rs`; the bodies in `zmm.rs` (AVX-512 VNNI, two
//! groups a vector) and `x86.rs` (256-bit, for AVX-VNNI and AVX2); the matrix itself is the
//! K-quants' [`SuperMatrix`].

use super::QuantKernel;
use super::superblock::{SuperGroup, SuperMatrix};

pub mod rule;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod zmm;

pub use rule::{BLOCK_BYTES, GroupQ6K, Q6KRows, RowQ6K, SUB, SUPER};

/// `W: [rows, cols]` as Q6_K super-blocks in groups of 8 rows (see `rule.rs`).
pub type Q6KMatrix = SuperMatrix<GroupQ6K>;

impl SuperGroup for GroupQ6K {
    const RAW: usize = BLOCK_BYTES;

    type Acts = Q6KRows;

    fn quantize(&mut self, j: usize, x: &[f32]) -> Option<()> {
        self.set_row(j, &rule::quantize_super(x)?);
        Some(())
    }

    fn read(&mut self, j: usize, raw: &[u8]) -> Option<()> {
        let row = RowQ6K::from_bytes(raw).filter(|r| r.d.is_finite())?;
        self.set_row(j, &row);
        Some(())
    }

    fn write(&self, j: usize, out: &mut Vec<u8>) {
        out.extend(self.row(j).to_bytes());
    }

    fn dequantize(&self, j: usize, out: &mut [f32]) {
        rule::dequantize_row(self, j, out);
    }

    fn acts(x: &[f32], n: usize, cols: usize) -> Q6KRows {
        Q6KRows::new(x, n, cols)
    }

    fn run(
        kernel: QuantKernel,
        w: &[Self],
        b: usize,
        q: &Q6KRows,
        n: usize,
        o0: usize,
        out: &mut [f32],
    ) {
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
    super::superblock::matmul_group(parts, x, n)
}

#[cfg(test)]
mod tests;
