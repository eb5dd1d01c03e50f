//! 6-bit weights: [`Q6KMatrix`] keeps `W: [out, in]` as GGUF's Q6_K super-blocks (256 weights
//! in 210 bytes: 6.56 bits a weight; the output head and half the value and down maps of a
//! Q4_K_M file), groups of 8 rows interleaved super-block by super-block, and multiplies f32
//! activations by it, the activations quantized per row and 256-value block. The format and the
//! arithmetic every kernel follows are in `rule.rs`; the bodies in `zmm.rs` (AVX-512 VNNI, two
//! groups a vector) and `x86.rs` (256-bit, for AVX-VNNI and AVX2); the matrix itself is the
//! K-quants' [`SuperMatrix`].

use super::group::Bodies;
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
    const WEIGHTS: usize = SUPER;
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

    const BODIES: Bodies<Self, Q6KRows> = Bodies {
        dot: |w, j, x, r| rule::dot_row(w, j, x.row(r)),
        #[cfg(target_arch = "x86_64")]
        x86: [
            // No tiles for super-blocks yet: AMX runs the AVX-512 VNNI body.
            zmm::matmul_rows,
            zmm::matmul_rows,
            x86::matmul_rows_avxvnni,
            x86::matmul_rows_avx2,
        ],
    };
}

#[cfg(test)]
mod tests;
