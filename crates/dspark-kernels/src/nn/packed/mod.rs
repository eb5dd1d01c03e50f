//! Weights packed in column panels, for the CPU products of a decode or verify step.
//!
//! A speculative round multiplies a few rows (one token per request, or `K + 1` for a
//! verification) by every weight of the model. [`PackedMatrix`] stores `W: [out, in]` as
//! `⌈out / 16⌉` panels of `[in, 16]` (16 consecutive output rows interleaved, zero-padded), so
//! a register tile multiplies up to [`TILE_ROWS`] input rows by several panels at once: per
//! input column `k`, one vector load of each panel and one broadcast of each input row feed
//! `rows × panels` fused multiply-adds, and every output is a lane of an accumulator, with no
//! horizontal sum. The inputs of a tile are interleaved by column first (its rows' values of
//! column `k` side by side), so a tile reads two forward streams, its panels and its inputs;
//! the x86 tiles prefetch their panels' streams 2 KiB ahead (into L2 for AVX-512, L1 for AVX2).
//! The weight is read once per call (a panel group stays in L2 while the input tiles pass over
//! it), and the packed form replaces the `[out, in]` one: no extra memory.
//!
//! Panels are stored in the weight's dtype ([`PanelElem`]: `f32`, `bf16`, `f16`), so a
//! memory-bound product reads 2 bytes per bf16 or f16 weight, and every product accumulates in
//! `f32` from `0.0` (then `+ bias`), by one rule per dtype that the AVX-512, AVX2 and portable
//! kernels all follow, so they give the same bits on every machine:
//! - **f32 and f16**: `acc = fma(w[k], x[k], acc)` for `k` ascending, each f16 column widened
//!   in registers (exactly).
//! - **bf16**: the activations are rounded to bf16 and each pair of columns is one step of
//!   AVX512-BF16's `vdpbf16ps` (the odd column's product, then the even one's, each added with
//!   one rounding; subnormals read and written as zeros): half the multiply instructions where
//!   the CPU has the instruction, so a verification of up to 12 rows stays bound by the weight
//!   reads. A bf16 panel stores its columns in pairs; the rule, its layout and the kernels that
//!   emulate it are in `pairs.rs`.
//!
//! Products stream their weights from memory, so large ones (weight bytes times rows) split the
//! panels over the thread pool (see [`crate::threads::split_product`] and
//! [`crate::threads::use_pool`]); each task
//! writes its own panels' lanes of every row straight into the row-major result, so a decode or
//! verify step allocates its output once and copies nothing. The views and the split are in
//! `view.rs`, the register tiles in `tile.rs` and `x86.rs` (bf16's in `pairs.rs` and
//! `pairs_x86.rs`).

use half::{bf16, f16};

use crate::cpu::pages::streamed_vec;
use crate::nn::WeightDtype;
use crate::nn::quant::q4k::Q4KMatrix;
use crate::nn::quant::q6k::Q6KMatrix;
use crate::nn::quant::{AnyQuant, Quant, QuantKernel, QuantMatrix};
use crate::view::Floats;

#[cfg(target_arch = "x86_64")]
mod amx;
mod dst;
mod elem;
mod group;
mod pairs;
#[cfg(target_arch = "x86_64")]
mod pairs_x86;
mod tile;
mod view;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "x86_64")]
pub use crate::cpu::amx::AMX_ENV;
pub use elem::PanelElem;
pub use group::{GroupPart, matmul_group};
pub use view::PanelView;

/// Output rows per panel (one AVX-512 vector, two AVX2 vectors).
pub const PANEL: usize = 16;

/// Input rows per register tile at most (`n` rows: a full first tile, the rest balanced).
pub const TILE_ROWS: usize = 12;

/// Which kernel runs a product (all give the same bits, but AMX, whose bf16 sums round its own
/// way: see `amx.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AMX-BF16 (with AVX512-BF16): bf16 panels through `tdpbf16ps` tiles (`amx.rs`; the
    /// sums round as the AMX unit does, see there), the rest as [`Self::Avx512Bf16`].
    Amx,
    /// AVX-512F with AVX512-BF16: bf16 panels through `vdpbf16ps`, the rest as [`Self::Avx512`].
    Avx512Bf16,
    /// AVX-512F: tiles of up to 6 rows × 4 panels, 9 rows × 3 panels or 12 rows × 2 panels.
    Avx512,
    /// AVX2 + FMA + F16C: tiles of up to 6 rows × 1 panel.
    Avx2,
    /// Plain Rust (`f32::mul_add`).
    Portable,
}

impl Kernel {
    /// The fastest kernel this CPU runs.
    pub fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::cpu::has_avx512() {
                if std::arch::is_x86_feature_detected!("avx512bf16") {
                    if amx::available() {
                        return Self::Amx;
                    }
                    return Self::Avx512Bf16;
                }
                return Self::Avx512;
            }
            if crate::cpu::has_avx2() && std::arch::is_x86_feature_detected!("f16c") {
                return Self::Avx2;
            }
        }
        Self::Portable
    }

    /// Whether this CPU runs `self`.
    pub fn available(self) -> bool {
        let best = Self::best();
        match self {
            Self::Portable => true,
            Self::Avx2 => best != Self::Portable,
            Self::Avx512 => matches!(best, Self::Avx512 | Self::Avx512Bf16 | Self::Amx),
            Self::Avx512Bf16 => matches!(best, Self::Avx512Bf16 | Self::Amx),
            Self::Amx => best == Self::Amx,
        }
    }

    /// Its name: `"amx-bf16"`, `"avx512-bf16"`, `"avx512"`, `"avx2"` or `"portable"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Amx => "amx-bf16",
            Self::Avx512Bf16 => "avx512-bf16",
            Self::Avx512 => "avx512",
            Self::Avx2 => "avx2",
            Self::Portable => "portable",
        }
    }

    /// `self` when [available](Kernel::available), else the portable kernel.
    pub(crate) fn or_portable(self) -> Self {
        if self.available() {
            self
        } else {
            Self::Portable
        }
    }

    /// The kernel that runs `T` panels for `self`: AMX multiplies bf16 pairs only, so f32 and
    /// f16 panels take [`Self::Avx512Bf16`]'s tiles.
    pub(crate) fn for_elem<T: PanelElem>(self) -> Self {
        if self == Self::Amx && T::PAIR == 1 {
            Self::Avx512Bf16
        } else {
            self
        }
    }
}

/// `W: [rows, cols]` in panel layout (see the module docs), stored as `T`.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedMatrix<T: PanelElem = f32> {
    rows: usize,
    cols: usize,
    /// `⌈rows / PANEL⌉` panels of `⌈cols / T::PAIR⌉ · T::PAIR · PANEL` values: panel `p`,
    /// column `k`, lane `j` at [`pairs::slot_index`] holds `W[p·PANEL + j, k]` (zero past
    /// `rows` and `cols`; bf16 subnormals as zeros of their sign, see `pairs.rs`).
    data: Vec<T>,
}

impl<T: PanelElem> PackedMatrix<T> {
    /// Pack row-major `w: [rows, cols]`; `None` when `w.len() != rows · cols`.
    pub fn pack(w: &[T], rows: usize, cols: usize) -> Option<Self> {
        if rows.checked_mul(cols) != Some(w.len()) {
            return None;
        }
        Some(Self::pack_strided(w, cols, rows, cols))
    }

    /// Pack the `[rows, cols]` matrix whose element `(o, k)` is `at(o, k)`.
    pub fn pack_with(rows: usize, cols: usize, at: impl Fn(usize, usize) -> T) -> Self {
        let panels = rows.div_ceil(PANEL);
        let len = pairs::panel_len::<T>(cols);
        let mut data = streamed_vec(panels * len);
        for (p, panel) in data.chunks_exact_mut(len.max(1)).enumerate() {
            for j in 0..PANEL.min(rows - p * PANEL) {
                let o = p * PANEL + j;
                for k in 0..cols {
                    panel[pairs::slot_index::<T>(k, j)] = stored(at(o, k));
                }
            }
        }
        Self { rows, cols, data }
    }

    /// Pack `W = Aᵀ` for `A: [cols, rows]` whose row `k` is `a[k · stride ..][..rows]`: panel `p`,
    /// column `k` is the 16 values `A[k][16p ..]`, one contiguous copy (attention's values,
    /// `Vᵀ`). Rows of `a` must lie inside it (callers check shapes).
    pub fn pack_transposed(a: &[T], stride: usize, rows: usize, cols: usize) -> Self {
        if T::PAIR > 1 {
            return Self::pack_with(rows, cols, |o, k| a[k * stride + o]);
        }
        let panels = rows.div_ceil(PANEL);
        // A per-call copy, not a weight kept for the model's life: no huge-page advice (one
        // madvise and whole-page faults per call would cost more than the TLB misses).
        let mut data = vec![T::default(); panels * cols * PANEL];
        for (p, panel) in data.chunks_exact_mut((cols * PANEL).max(1)).enumerate() {
            let (d0, width) = (p * PANEL, PANEL.min(rows - p * PANEL));
            for (k, dst) in panel.chunks_exact_mut(PANEL).enumerate() {
                let at = k * stride + d0;
                dst[..width].copy_from_slice(&a[at..at + width]);
            }
        }
        Self { rows, cols, data }
    }

    /// Pack `W: [rows, cols]` whose row `o` is `a[o · stride ..][..cols]` (a strided view).
    pub fn pack_strided(a: &[T], stride: usize, rows: usize, cols: usize) -> Self {
        Self::pack_rows(rows, cols, |o, dst| {
            let at = o * stride;
            dst.copy_from_slice(&a[at..at + cols]);
        })
    }

    /// Pack `W: [rows, cols]` whose row `o` `row(o, buf)` writes into `buf` (`cols` values).
    fn pack_rows(rows: usize, cols: usize, row: impl Fn(usize, &mut [T])) -> Self {
        let panels = rows.div_ceil(PANEL);
        let len = pairs::panel_len::<T>(cols);
        let mut data = streamed_vec(panels * len);
        let mut buf = vec![T::default(); cols];
        for (p, panel) in data.chunks_exact_mut(len.max(1)).enumerate() {
            for j in 0..PANEL.min(rows - p * PANEL) {
                row(p * PANEL + j, &mut buf);
                for (k, &v) in buf.iter().enumerate() {
                    panel[pairs::slot_index::<T>(k, j)] = stored(v);
                }
            }
        }
        Self { rows, cols, data }
    }

    /// Pack row-major `w: [rows, cols]` of any dtype into `T` (exact when `T` is at least as
    /// wide, round to nearest even otherwise); `None` when `w.len() != rows · cols`.
    pub fn pack_floats(w: Floats<'_>, rows: usize, cols: usize) -> Option<Self> {
        if rows.checked_mul(cols) != Some(w.len()) {
            return None;
        }
        Some(match w {
            Floats::F32(s) => Self::pack_rows(rows, cols, |o, dst| convert(&s[o * cols..], dst)),
            Floats::BF16(s) => Self::pack_rows(rows, cols, |o, dst| convert(&s[o * cols..], dst)),
            Floats::F16(s) => Self::pack_rows(rows, cols, |o, dst| convert(&s[o * cols..], dst)),
        })
    }

    /// Output rows (`out`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns (`in`).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of the packed panels (what one product reads).
    pub fn bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<T>()
    }

    /// The row-major `[rows, cols]` matrix back, widened to `f32` (exact; bf16 subnormals read
    /// as the zeros packing stored).
    pub fn unpack(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.rows * self.cols];
        for (o, dst) in w.chunks_exact_mut(self.cols.max(1)).enumerate() {
            self.row_into(o, dst);
        }
        w
    }

    /// Row `o`'s `cols` values (as [`Self::unpack`] gives them) into `out`. Panics when
    /// `o >= rows` or `out` is not `cols` long.
    pub fn row_into(&self, o: usize, out: &mut [f32]) {
        assert!(
            o < self.rows && out.len() == self.cols,
            "row {o} of {}",
            self.rows
        );
        let (p, j) = (o / PANEL, o % PANEL);
        let panel = &self.data[p * pairs::panel_len::<T>(self.cols)..];
        for (k, d) in out.iter_mut().enumerate() {
            *d = panel[pairs::slot_index::<T>(k, j)].to_f32();
        }
    }

    /// `y = x · Wᵀ (+ bias)` for row-major `x: [n, cols]`, giving row-major `[n, rows]`, with
    /// the fastest kernel. `None` when `x.len() != n · cols` or `bias` is not `rows` long.
    pub fn matmul(&self, x: &[f32], n: usize, bias: Option<&[f32]>) -> Option<Vec<f32>> {
        self.matmul_with(Kernel::best(), x, n, bias)
    }

    /// [`Self::matmul`] with a chosen kernel (the portable one when `kernel` is not
    /// [available](Kernel::available)).
    pub fn matmul_with(
        &self,
        kernel: Kernel,
        x: &[f32],
        n: usize,
        bias: Option<&[f32]>,
    ) -> Option<Vec<f32>> {
        self.view().matmul_with(kernel, x, n, bias)
    }

    /// The matrix as a [`PanelView`] (panels and columns contiguous).
    pub fn view(&self) -> PanelView<'_, T> {
        PanelView::contiguous(&self.data, self.rows, self.cols)
    }
}

/// `v` as a panel stores it: bf16 subnormals as zeros of their sign (how `vdpbf16ps` reads
/// them, see `pairs.rs`), every other value as it is.
#[inline(always)]
fn stored<T: PanelElem>(v: T) -> T {
    if T::PAIR > 1 && v.to_f32().is_subnormal() {
        T::from_f32(0f32.copysign(v.to_f32()))
    } else {
        v
    }
}

/// `dst[i] = T(src[i])` for the first `dst.len()` values of `src`.
fn convert<S: PanelElem, T: PanelElem>(src: &[S], dst: &mut [T]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = T::from_f32(s.to_f32());
    }
}

/// A weight packed for the host products: a [`PackedMatrix`] in whichever float dtype it is
/// kept in, or quantized blocks (Q8_0: [`QuantMatrix`]; Q4_K: [`Q4KMatrix`]; Q6_K:
/// [`Q6KMatrix`]).
#[derive(Debug, Clone, PartialEq)]
pub enum PackedWeight {
    /// `f32` panels.
    F32(PackedMatrix<f32>),
    /// `bf16` panels.
    BF16(PackedMatrix<bf16>),
    /// `f16` panels.
    F16(PackedMatrix<f16>),
    /// Q8_0 blocks (see [`crate::nn::quant`]).
    Q8(QuantMatrix),
    /// Q4_K super-blocks (see [`crate::nn::quant::q4k`]).
    Q4K(Q4KMatrix),
    /// Q6_K super-blocks (see [`crate::nn::quant::q6k`]).
    Q6K(Q6KMatrix),
}

/// One product of a [`PackedWeight::matmul_group`]: the weight and its bias, if any.
pub type WeightPart<'a> = (&'a PackedWeight, Option<&'a [f32]>);

/// `$body` with `$m` bound to the matrix of any [`PackedWeight`] variant (the methods it calls
/// exist on [`PackedMatrix`], [`QuantMatrix`] and [`Q4KMatrix`] alike).
macro_rules! each {
    ($w:expr, $m:ident => $body:expr) => {
        match $w {
            PackedWeight::F32($m) => $body,
            PackedWeight::BF16($m) => $body,
            PackedWeight::F16($m) => $body,
            PackedWeight::Q8($m) => $body,
            PackedWeight::Q4K($m) => $body,
            PackedWeight::Q6K($m) => $body,
        }
    };
}

/// `$body` with `$m` bound to the [`PackedMatrix`] of a float variant; `$q` for a quantized one
/// (the methods it calls exist on [`QuantMatrix`] and [`Q4KMatrix`] alike).
macro_rules! each_float {
    ($w:expr, $m:ident => $body:expr, $q:ident => $qbody:expr) => {
        match $w {
            PackedWeight::F32($m) => $body,
            PackedWeight::BF16($m) => $body,
            PackedWeight::F16($m) => $body,
            PackedWeight::Q8($q) => $qbody,
            PackedWeight::Q4K($q) => $qbody,
            PackedWeight::Q6K($q) => $qbody,
        }
    };
}

impl PackedWeight {
    /// Pack row-major `w: [rows, cols]` (any dtype) as `dtype` panels; `None` when
    /// `w.len() != rows · cols`.
    pub fn pack(w: Floats<'_>, rows: usize, cols: usize, dtype: WeightDtype) -> Option<Self> {
        Some(match dtype {
            WeightDtype::F32 => Self::F32(PackedMatrix::pack_floats(w, rows, cols)?),
            WeightDtype::BF16 => Self::BF16(PackedMatrix::pack_floats(w, rows, cols)?),
            WeightDtype::F16 => Self::F16(PackedMatrix::pack_floats(w, rows, cols)?),
        })
    }

    /// Quantize row-major `w: [rows, cols]` (any float dtype) as `quant` blocks; `None` as
    /// [`QuantMatrix::quantize`] and [`Q4KMatrix::quantize`].
    pub fn quantize(w: Floats<'_>, rows: usize, cols: usize, quant: Quant) -> Option<Self> {
        match quant {
            Quant::Q8_0 => QuantMatrix::quantize(w, rows, cols).map(Self::Q8),
            Quant::Q4K => Q4KMatrix::quantize(w, rows, cols).map(Self::Q4K),
            Quant::Q6K => Q6KMatrix::quantize(w, rows, cols).map(Self::Q6K),
        }
    }

    /// The panels' dtype (a quantized weight: `f32`, the values its blocks dequantize to).
    pub fn dtype(&self) -> WeightDtype {
        match self {
            Self::F32(_) | Self::Q8(_) | Self::Q4K(_) | Self::Q6K(_) => WeightDtype::F32,
            Self::BF16(_) => WeightDtype::BF16,
            Self::F16(_) => WeightDtype::F16,
        }
    }

    /// The quantized format, when the weight is quantized.
    pub fn quant(&self) -> Option<Quant> {
        match self {
            Self::Q8(_) => Some(Quant::Q8_0),
            Self::Q4K(_) => Some(Quant::Q4K),
            Self::Q6K(_) => Some(Quant::Q6K),
            _ => None,
        }
    }

    /// A quantized weight's blocks as a GGUF file stores them (`None` for float panels).
    pub fn to_gguf(&self) -> Option<Vec<u8>> {
        match self {
            Self::Q8(q) => Some(q.to_gguf()),
            Self::Q4K(q) => Some(q.to_gguf()),
            Self::Q6K(q) => Some(q.to_gguf()),
            Self::F32(_) | Self::BF16(_) | Self::F16(_) => None,
        }
    }

    /// Output rows (`out`).
    pub fn rows(&self) -> usize {
        each!(self, m => m.rows())
    }

    /// Input columns (`in`).
    pub fn cols(&self) -> usize {
        each!(self, m => m.cols())
    }

    /// Bytes of the packed panels (or blocks).
    pub fn bytes(&self) -> usize {
        each!(self, m => m.bytes())
    }

    /// The row-major matrix back as `f32` (exact; a quantized one's dequantized values).
    pub fn unpack(&self) -> Vec<f32> {
        each_float!(self, m => m.unpack(), q => q.dequantize())
    }

    /// Row `o`'s values (as [`Self::unpack`] gives them) into `out` (`cols` long). Panics when
    /// `o >= rows` or `out` is not `cols` long.
    pub fn row_into(&self, o: usize, out: &mut [f32]) {
        each!(self, m => m.row_into(o, out))
    }

    /// [`PackedMatrix::matmul`].
    pub fn matmul(&self, x: &[f32], n: usize, bias: Option<&[f32]>) -> Option<Vec<f32>> {
        each!(self, m => m.matmul(x, n, bias))
    }

    /// [`matmul_group`] over packed weights with the fastest kernel: one pool dispatch for
    /// the products of `x` with every weight of `parts`, each the bits of its own
    /// [`Self::matmul`] (quantized weights, of one format or several:
    /// [`crate::nn::quant::matmul_mixed`]). `None` when the weights are not all quantized or
    /// all floats of one dtype, or as [`matmul_group`].
    pub fn matmul_group(parts: &[WeightPart<'_>], x: &[f32], n: usize) -> Option<Vec<Vec<f32>>> {
        fn views<'a, T: PanelElem>(
            parts: &[WeightPart<'a>],
            pick: impl Fn(&'a PackedWeight) -> Option<&'a PackedMatrix<T>>,
        ) -> Option<Vec<GroupPart<'a, T>>> {
            parts
                .iter()
                .map(|&(w, b)| Some((pick(w)?.view(), b)))
                .collect()
        }
        let kernel = Kernel::best();
        if parts.iter().all(|(w, _)| w.quant().is_some()) {
            // Quantized parts, of one format or several: one dispatch, each format's
            // activations quantized once.
            let q: Option<Vec<_>> = parts
                .iter()
                .map(|&(w, b)| {
                    let m = match w {
                        Self::Q8(q) => AnyQuant::Q8(q),
                        Self::Q4K(q) => AnyQuant::Q4K(q),
                        Self::Q6K(q) => AnyQuant::Q6K(q),
                        Self::F32(_) | Self::BF16(_) | Self::F16(_) => return None,
                    };
                    Some((m, b))
                })
                .collect();
            return crate::nn::quant::matmul_mixed(&q?, x, n);
        }
        match parts.first()?.0 {
            Self::Q8(_) | Self::Q4K(_) | Self::Q6K(_) => None,
            Self::F32(_) => {
                let v = views(parts, |w| if let Self::F32(m) = w { Some(m) } else { None })?;
                matmul_group(kernel, &v, x, n)
            }
            Self::BF16(_) => {
                let v = views(
                    parts,
                    |w| if let Self::BF16(m) = w { Some(m) } else { None },
                )?;
                matmul_group(kernel, &v, x, n)
            }
            Self::F16(_) => {
                let v = views(parts, |w| if let Self::F16(m) = w { Some(m) } else { None })?;
                matmul_group(kernel, &v, x, n)
            }
        }
    }

    /// [`PackedMatrix::matmul_with`].
    pub fn matmul_with(
        &self,
        kernel: Kernel,
        x: &[f32],
        n: usize,
        bias: Option<&[f32]>,
    ) -> Option<Vec<f32>> {
        each_float!(self, m => m.matmul_with(kernel, x, n, bias), q => {
            let body = if kernel == Kernel::Portable {
                QuantKernel::Portable
            } else {
                QuantKernel::best()
            };
            q.matmul_with(body, x, n, bias)
        })
    }
}

#[cfg(test)]
mod tests;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests_amx;
