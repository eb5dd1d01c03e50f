//! 4-bit weights: [`Q4KMatrix`] keeps `W: [out, in]` as GGUF's Q4_K super-blocks (256 weights
//! in 144 bytes: 4.5 bits a weight), groups of 8 rows interleaved super-block by super-block,
//! and multiplies f32 activations by it, the activations quantized per row and 256-value block.
//! The format and the arithmetic every kernel follows are in `rule.rs`; the bodies in
//! `zmm.rs` (AVX-512 VNNI), `vnni.rs` (VNNI on 256-bit vectors) and `x86.rs` (AVX2); the
//! matrix itself is the K-quants' [`SuperMatrix`].

use super::QuantKernel;
use super::superblock::{SuperGroup, SuperMatrix};

pub mod rule;
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

    fn run(
        kernel: QuantKernel,
        w: &[Self],
        b: usize,
        q: &Q8KRows,
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
            QuantKernel::AvxVnni => unsafe { vnni::matmul_rows_avxvnni(&op, n, out) },
            #[cfg(target_arch = "x86_64")]
            QuantKernel::Avx2 => unsafe { x86::matmul_rows(&op, n, out) },
            _ => rule::matmul_rows(w, b, q, n, o0, out),
        }
    }
}

/// One product of a Q4_K group: the weight and its bias (`rows` values), if any.
pub type Q4KPart<'a> = (&'a Q4KMatrix, Option<&'a [f32]>);

/// [`super::matmul_group`] for Q4_K weights: the activations quantized once, every part's
/// outputs in one pool dispatch, each the bits of its own [`Q4KMatrix::matmul`].
pub fn matmul_group(parts: &[Q4KPart<'_>], x: &[f32], n: usize) -> Option<Vec<Vec<f32>>> {
    super::superblock::matmul_group(parts, x, n)
}

#[cfg(test)]
mod tests;
