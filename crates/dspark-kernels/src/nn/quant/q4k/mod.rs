//! 4-bit weights: [`Q4KMatrix`] keeps `W: [out, in]` as GGUF's Q4_K super-blocks (256 weights
//! in 144 bytes: 4.5 bits a weight), groups of 8 rows interleaved super-block by super-block,
//! and multiplies f32 activations by it, the activations quantized per row and 256-value block.
//! The format and the arithmetic every kernel follows are in `rule.rs`; the bodies in
//! `zmm.rs` (AVX-512 VNNI), `vnni.rs` (VNNI on 256-bit vectors) and `x86.rs` (AVX2); the
//! matrix itself is the K-quants' [`SuperMatrix`].

use super::group::Bodies;
use super::superblock::{SuperGroup, SuperMatrix};

pub mod rule;
mod search;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod zmm;

pub use rule::{BLOCK_BYTES, GroupQ4K, Q8KRows, SCALE_BYTES, SUB, SUPER};

/// `W: [rows, cols]` as Q4_K super-blocks in groups of 8 rows (see `rule.rs`).
pub type Q4KMatrix = SuperMatrix<GroupQ4K>;

impl SuperGroup for GroupQ4K {
    const WEIGHTS: usize = SUPER;
    const RAW: usize = BLOCK_BYTES;

    type Acts = Q8KRows;

    fn quantize(&mut self, j: usize, x: &[f32]) -> Option<()> {
        let (d, dmin, scales, qs) = rule::quantize_super(x)?;
        (self.d[j], self.dmin[j]) = (d, dmin);
        self.set_row(j, &scales, &qs);
        Some(())
    }

    fn read(&mut self, j: usize, raw: &[u8]) -> Option<()> {
        let f16_at = |i: usize| half::f16::from_le_bytes([raw[i], raw[i + 1]]);
        let (d, dmin) = (f16_at(0), f16_at(2));
        if !(d.is_finite() && dmin.is_finite()) {
            return None;
        }
        (self.d[j], self.dmin[j]) = (d, dmin);
        let scales: &[u8; SCALE_BYTES] = raw.get(4..16)?.try_into().ok()?;
        let qs: &[u8; SUPER / 2] = raw.get(16..BLOCK_BYTES)?.try_into().ok()?;
        self.set_row(j, scales, qs);
        Some(())
    }

    fn write(&self, j: usize, out: &mut Vec<u8>) {
        out.extend(self.d[j].to_le_bytes());
        out.extend(self.dmin[j].to_le_bytes());
        out.extend(self.scales_of(j));
        out.extend(self.nibbles_of(j));
    }

    fn dequantize(&self, j: usize, out: &mut [f32]) {
        rule::dequantize_row(self, j, out);
    }

    fn acts(x: &[f32], n: usize, cols: usize) -> Q8KRows {
        Q8KRows::new(x, n, cols)
    }

    const BODIES: Bodies<Self, Q8KRows> = Bodies {
        dot: |w, j, x, r| rule::dot_row(w, j, x.row(r)),
        #[cfg(target_arch = "x86_64")]
        x86: [
            // No tiles for super-blocks yet: AMX runs the AVX-512 VNNI body.
            zmm::matmul_rows,
            zmm::matmul_rows,
            vnni::matmul_rows_avxvnni,
            x86::matmul_rows,
        ],
    };
}

#[cfg(test)]
mod tests;
