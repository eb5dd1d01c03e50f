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
//! the x86 tiles prefetch their panels' streams a few lines ahead of the hardware prefetchers.
//! The weight is read once per call (a panel group stays in L2 while the input tiles pass over
//! it), and the packed form replaces the `[out, in]` one: no extra memory.
//!
//! Panels are stored in the weight's dtype ([`PanelElem`]: `f32`, `bf16`, `f16`), so a
//! memory-bound product reads 2 bytes per bf16 or f16 weight; the tiles widen each 16-lane
//! column in registers (exactly) and accumulate in `f32`. Every output accumulates
//! `acc = fma(w[k], x[k], acc)` for `k` ascending from `0.0` (then `+ bias`), so the AVX-512,
//! AVX2 and portable kernels give the same bits on every machine, in every dtype.
//!
//! AVX512-BF16's `vdpbf16ps` is not used: it takes both operands as bf16 (the activations
//! would be rounded to 8 bits of mantissa), adds each pair of products before the
//! accumulator and flushes subnormals, so it cannot give the widen-then-fma bits; and the
//! products it would speed up are bound by the weight reads, not the multiply-adds.
//!
//! Products stream their weights from memory, so large ones split the panels over the thread
//! pool (see [`crate::threads::split_stream`] and [`crate::threads::use_pool`]); each task
//! writes its own panels' lanes of every row straight into the row-major result, so a decode or
//! verify step allocates its output once and copies nothing. The views and the split are in
//! `view.rs`, the register tiles in `tile.rs` and `x86.rs`.

use half::{bf16, f16};

use crate::cpu::pages::streamed_vec;
use crate::nn::WeightDtype;
use crate::view::Floats;

mod elem;
mod group;
mod tile;
mod view;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use elem::PanelElem;
pub use group::{GroupPart, matmul_group};
pub use view::PanelView;

/// Output rows per panel (one AVX-512 vector, two AVX2 vectors).
pub const PANEL: usize = 16;

/// Input rows per register tile at most (`n` rows: a full first tile, the rest balanced).
pub const TILE_ROWS: usize = 12;

/// Which kernel runs a product (all give the same bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
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
        match self {
            Self::Portable => true,
            Self::Avx2 => matches!(Self::best(), Self::Avx2 | Self::Avx512),
            Self::Avx512 => Self::best() == Self::Avx512,
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
}

/// `W: [rows, cols]` in panel layout (see the module docs), stored as `T`.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedMatrix<T: PanelElem = f32> {
    rows: usize,
    cols: usize,
    /// `⌈rows / PANEL⌉ · cols · PANEL` values: panel `p`, column `k`, lane `j` holds
    /// `W[p·PANEL + j, k]` (zero past `rows`).
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
        let mut data = streamed_vec(panels * cols * PANEL);
        for (p, panel) in data.chunks_exact_mut((cols * PANEL).max(1)).enumerate() {
            for j in 0..PANEL.min(rows - p * PANEL) {
                let o = p * PANEL + j;
                for k in 0..cols {
                    panel[k * PANEL + j] = at(o, k);
                }
            }
        }
        Self { rows, cols, data }
    }

    /// Pack `W = Aᵀ` for `A: [cols, rows]` whose row `k` is `a[k · stride ..][..rows]`: panel `p`,
    /// column `k` is the 16 values `A[k][16p ..]`, one contiguous copy (attention's values,
    /// `Vᵀ`). Rows of `a` must lie inside it (callers check shapes).
    pub fn pack_transposed(a: &[T], stride: usize, rows: usize, cols: usize) -> Self {
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
        let mut data = streamed_vec(panels * cols * PANEL);
        let mut buf = vec![T::default(); cols];
        for (p, panel) in data.chunks_exact_mut((cols * PANEL).max(1)).enumerate() {
            for j in 0..PANEL.min(rows - p * PANEL) {
                row(p * PANEL + j, &mut buf);
                for (k, &v) in buf.iter().enumerate() {
                    panel[k * PANEL + j] = v;
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

    /// The row-major `[rows, cols]` matrix back, widened to `f32` (exact).
    pub fn unpack(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.rows * self.cols];
        for (o, dst) in w.chunks_exact_mut(self.cols.max(1)).enumerate() {
            let (p, j) = (o / PANEL, o % PANEL);
            let panel = &self.data[p * self.cols * PANEL..];
            for (k, d) in dst.iter_mut().enumerate() {
                *d = panel[k * PANEL + j].to_f32();
            }
        }
        w
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

/// `dst[i] = T(src[i])` for the first `dst.len()` values of `src`.
fn convert<S: PanelElem, T: PanelElem>(src: &[S], dst: &mut [T]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = T::from_f32(s.to_f32());
    }
}

/// A [`PackedMatrix`] in whichever dtype its weight is kept in.
#[derive(Debug, Clone, PartialEq)]
pub enum PackedWeight {
    /// `f32` panels.
    F32(PackedMatrix<f32>),
    /// `bf16` panels.
    BF16(PackedMatrix<bf16>),
    /// `f16` panels.
    F16(PackedMatrix<f16>),
}

/// One product of a [`PackedWeight::matmul_group`]: the weight and its bias, if any.
pub type WeightPart<'a> = (&'a PackedWeight, Option<&'a [f32]>);

/// `$body` with `$m` bound to the [`PackedMatrix`] of any [`PackedWeight`] variant.
macro_rules! each {
    ($w:expr, $m:ident => $body:expr) => {
        match $w {
            PackedWeight::F32($m) => $body,
            PackedWeight::BF16($m) => $body,
            PackedWeight::F16($m) => $body,
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

    /// The panels' dtype.
    pub fn dtype(&self) -> WeightDtype {
        match self {
            Self::F32(_) => WeightDtype::F32,
            Self::BF16(_) => WeightDtype::BF16,
            Self::F16(_) => WeightDtype::F16,
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

    /// Bytes of the packed panels.
    pub fn bytes(&self) -> usize {
        each!(self, m => m.bytes())
    }

    /// The row-major matrix back as `f32` (exact).
    pub fn unpack(&self) -> Vec<f32> {
        each!(self, m => m.unpack())
    }

    /// [`PackedMatrix::matmul`].
    pub fn matmul(&self, x: &[f32], n: usize, bias: Option<&[f32]>) -> Option<Vec<f32>> {
        each!(self, m => m.matmul(x, n, bias))
    }

    /// [`matmul_group`] over packed weights with the fastest kernel: one pool dispatch for
    /// the products of `x` with every weight of `parts`, each the bits of its own
    /// [`Self::matmul`]. `None` when the weights are not all of one dtype, or as
    /// [`matmul_group`].
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
        match parts.first()?.0 {
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
        each!(self, m => m.matmul_with(kernel, x, n, bias))
    }
}

#[cfg(test)]
mod tests;
