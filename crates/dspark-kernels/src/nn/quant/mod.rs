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
//! shared pieces are in `simd.rs`. Q8_0 has a fifth, AMX tiles for products of many rows
//! (`amx.rs`).
//!
//! A decode step on a CPU is bound by the bytes it reads: a Q8_0 weight reads about half a bf16
//! one's, a Q4_K weight about a quarter. A product reads each weight block once for all its rows
//! (a verification's 9 rows included) and splits the outputs over the pool for large products
//! (weight bytes times rows), as the panel kernel does ([`crate::threads::split_product`]).

mod acts;
#[cfg(target_arch = "x86_64")]
mod amx;
mod group;
mod mixed;
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

pub use acts::QuantRows;
pub(crate) use group::{Blocks, Bodies, group_with};
pub use mixed::{AnyQuant, matmul_mixed};
pub use rule::{BLOCK, GROUP, GroupQ8};
use superblock::{SuperGroup, SuperMatrix};

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
    /// AMX-INT8 with the AVX-512 VNNI body's extensions: Q8_0's block sums from `tdpbssd`
    /// tiles (`amx.rs`) in products of 12 rows or more; fewer rows, and Q4_K and Q6_K, as
    /// [`Self::Avx512Vnni`].
    Amx,
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
    pub const ALL: [Self; 5] = [
        Self::Amx,
        Self::Avx512Vnni,
        Self::AvxVnni,
        Self::Avx2,
        Self::Portable,
    ];

    /// Its name (`amx-int8`, `avx512vnni`, `avxvnni`, `avx2`, `portable`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Amx => "amx-int8",
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
            let vnni512 = avx2
                && has!("avx512f")
                && has!("avx512vl")
                && has!("avx512bw")
                && has!("avx512vnni");
            match self {
                Self::Amx => vnni512 && amx::available(),
                Self::Avx512Vnni => vnni512,
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
pub type QuantMatrix = SuperMatrix<GroupQ8>;

impl SuperGroup for GroupQ8 {
    const WEIGHTS: usize = BLOCK;
    /// An f16 scale, then 32 signed bytes.
    const RAW: usize = 2 + BLOCK;

    type Acts = QuantRows;

    fn quantize(&mut self, j: usize, x: &[f32]) -> Option<()> {
        let mut q = [0i8; BLOCK];
        let d = half::f16::from_f32(rule::quantize_block(x, &mut q));
        self.set_row(j, &q);
        self.d[j] = d;
        d.is_finite().then_some(())
    }

    fn read(&mut self, j: usize, raw: &[u8]) -> Option<()> {
        let d = half::f16::from_le_bytes([*raw.first()?, *raw.get(1)?]);
        let q: &[u8; BLOCK] = raw.get(2..2 + BLOCK)?.try_into().ok()?;
        self.d[j] = d;
        self.set_row(j, &q.map(|b| b as i8));
        d.is_finite().then_some(())
    }

    fn write(&self, j: usize, out: &mut Vec<u8>) {
        out.extend(self.d[j].to_le_bytes());
        out.extend(self.row(j).map(|q| q as u8));
    }

    fn dequantize(&self, j: usize, out: &mut [f32]) {
        let d = self.d[j].to_f32();
        for (v, q) in out.iter_mut().zip(self.row(j)) {
            *v = d * f32::from(q);
        }
    }

    fn acts(x: &[f32], n: usize, cols: usize) -> QuantRows {
        QuantRows::new(x, n, cols)
    }

    const BODIES: Bodies<Self, QuantRows> = Bodies {
        dot: |w, j, x, r| {
            let (xd, xq, _) = x.row(r);
            rule::dot_row(w, j, xd, xq)
        },
        #[cfg(target_arch = "x86_64")]
        x86: [
            amx::matmul_rows,
            zmm::matmul_rows,
            vnni::matmul_rows_avxvnni,
            x86::matmul_rows,
        ],
    };
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

#[cfg(test)]
mod tests;
