//! bf16 panels: column pairs multiplied by the `vdpbf16ps` rule, on every kernel.
//!
//! A bf16 panel stores its columns in pairs: slot `s` holds columns `2s` and `2s + 1` of its 16
//! output rows interleaved (lane `j`'s two values side by side, 64 bytes), which is the weight
//! operand of AVX512-BF16's `vdpbf16ps`. The activations are rounded to bf16 (to nearest even)
//! once per product, as llama.cpp and a torch bf16 model do, so a bf16 product does half the
//! multiply-adds of a widened one: a verification of `K + 1` rows stays bound by the weight
//! reads instead of the FMA ports (measured on an AMD EPYC, 9 rows of the memory-bound pair's
//! MLP: 21.7 → 29.8 GB/s, the one-row rate).
//!
//! **The rule** (`vdpbf16ps` as the Intel SDM defines it): with `daz(v)` = `v`, or a zero of
//! `v`'s sign when `v` is subnormal, each output starts at `+0.0` and, for each slot in order,
//! `acc = daz(fma(w_odd, x_odd, acc))`, then `acc = daz(fma(w_even, x_even, acc))`, on
//! `daz`-ed operands; then `+ bias`. Every kernel gives these bits:
//! - **AVX512-BF16** runs `vdpbf16ps` itself ([`Kernel::Avx512Bf16`]).
//! - **AVX-512F and AVX2** widen the pairs in registers (a shift and a mask, no shuffle) and run
//!   the two FMAs, in the default MXCSR state. The rule differs from a plain FMA only where a
//!   subnormal meets it: an operand (the denormal-operand flag) or a rounded result (the
//!   underflow flag, or a subnormal left in an accumulator). The tile checks the flags and its
//!   accumulators, and on any of them computes again with every `daz` spelled out (`exact`,
//!   AVX2). Weights and activations hold no subnormals (packing and the input rounding flush
//!   them, as the instruction would read them), so only a partial sum below 2^-126 takes that
//!   path.
//! - **Portable** spells out the rule with `f32::mul_add`.
//!
//! Checked against the instruction on an AMD EPYC (Zen 4): 32 M lanes of random, tiny and
//! subnormal operands, no difference.

use half::bf16;

use super::dst::{Dst, row_tiles};
use super::{Kernel, PANEL, PanelElem};

/// `v`, or a zero of its sign when it is subnormal (the instruction's DAZ and FTZ).
#[inline(always)]
pub(super) fn daz(v: f32) -> f32 {
    if v.is_subnormal() {
        0f32.copysign(v)
    } else {
        v
    }
}

/// `v` rounded to bf16 (nearest even) as the rule reads it: a subnormal result as a signed
/// zero.
#[inline(always)]
pub(super) fn round_input(v: f32) -> bf16 {
    bf16::from_bits(round_bits(v))
}

/// [`round_input`]'s bits, in integer steps a compiler vectorizes: a NaN keeps its sign and top
/// payload, made quiet (as `half` converts it); any other value rounds to nearest even (past
/// the largest finite value, to infinity), and a subnormal result becomes its sign's zero.
#[inline(always)]
fn round_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let flushed = if rounded & 0x7f80 == 0 {
        rounded & 0x8000
    } else {
        rounded
    };
    if v.is_nan() {
        (b >> 16) as u16 | 0x0040
    } else {
        flushed
    }
}

/// One slot's word for `vdpbf16ps` and AMX: `odd` rounded in the top half, `even` below.
#[inline(always)]
pub(super) fn word(even: f32, odd: f32) -> f32 {
    f32::from_bits(u32::from(round_bits(odd)) << 16 | u32::from(round_bits(even)))
}

/// Values each row gives a tile per slot: the `(x_odd, x_even)` pair as two f32 values for the
/// widening kernels, or one word (`x_odd` in the top half) for `vdpbf16ps`.
pub(super) fn per_slot(kernel: Kernel) -> usize {
    if matches!(kernel, Kernel::Avx512Bf16 | Kernel::Amx) {
        1
    } else {
        2
    }
}

/// The tiles' inputs of row-major `x: [n, cols]` for `kernel`: each row tile `(i0, m)` of
/// [`row_tiles`] at `[i0·w, (i0 + m)·w)` (`w = ⌈cols / 2⌉ · per_slot`), holding row `i0 + q`'s
/// slot `s` at `i0·w + (s·m + q)·per_slot`, or at `(i0 + q)·w + s` (row-major, whatever the
/// tiles) for AMX (a missing last odd column reads 0).
pub(super) fn inputs(
    kernel: Kernel,
    x: &[f32],
    n: usize,
    cols: usize,
    max_rows: usize,
) -> Vec<f32> {
    let (slots, e) = (cols.div_ceil(2), per_slot(kernel));
    if kernel == Kernel::Amx {
        // Row-major words: each row's pairs in order, in one pass a compiler vectorizes (and
        // no zeroed buffer first).
        let mut out = Vec::with_capacity(n * slots);
        #[cfg(target_arch = "x86_64")]
        let vector = std::arch::is_x86_feature_detected!("avx512bf16");
        for row in x.chunks_exact(cols).take(n) {
            #[cfg(target_arch = "x86_64")]
            let done = if vector {
                // SAFETY: the CPU runs AVX512-BF16 (and so AVX-512F).
                unsafe { super::pairs_x86::words512(row, &mut out) }
            } else {
                0
            };
            #[cfg(not(target_arch = "x86_64"))]
            let done = 0;
            let (pairs, last) = row[done..].split_at((cols - done) / 2 * 2);
            out.extend(pairs.chunks_exact(2).map(|p| word(p[0], p[1])));
            out.extend(last.first().map(|&v| word(v, 0.0)));
        }
        return out;
    }
    let mut out = vec![0f32; n * slots * e];
    for (i0, m) in row_tiles(n, max_rows) {
        let tile = &mut out[i0 * slots * e..(i0 + m) * slots * e];
        for q in 0..m {
            let row = &x[(i0 + q) * cols..(i0 + q + 1) * cols];
            for (s, pair) in row.chunks(2).enumerate() {
                let (even, odd) = (pair[0], pair.get(1).copied().unwrap_or(0.0));
                let at = (s * m + q) * e;
                if e == 1 {
                    tile[at] = word(even, odd);
                } else {
                    let (even, odd) = (round_input(even), round_input(odd));
                    tile[at] = odd.to_f32();
                    tile[at + 1] = even.to_f32();
                }
            }
        }
    }
    out
}

/// `m` rows × `np` panels of bf16 pairs into `dst`, by the rule, on `kernel` (as
/// [`super::tile::tile`], with `xs` from [`inputs`] for the same kernel).
///
/// # Safety
/// As [`super::tile::tile`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile(
    kernel: Kernel,
    w: &[bf16],
    np: usize,
    cols: usize,
    strides: (usize, usize),
    xs: &[f32],
    m: usize,
    dst: Dst,
) {
    let slots = cols.div_ceil(2);
    debug_assert!(w.len() == (np - 1) * strides.0 + (slots - 1) * strides.1 + 2 * PANEL);
    debug_assert!(xs.len() == m * slots * per_slot(kernel));
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the kernel is only chosen where the CPU runs it (AMX granted to the process);
        // shapes as asserted.
        Kernel::Amx => unsafe { super::amx::tile(w, np, slots, strides, xs, m, dst) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the kernel is only chosen where the CPU runs it; shapes as asserted.
        Kernel::Avx512Bf16 | Kernel::Avx512 | Kernel::Avx2 => unsafe {
            super::pairs_x86::tile(kernel, w, np, slots, strides, xs, m, dst)
        },
        // SAFETY: by the caller's contract.
        _ => unsafe { tile_portable(w, np, slots, strides, xs, m, dst) },
    }
}

/// The rule in plain Rust, for `xs` of two values per slot.
///
/// # Safety
/// As [`tile`].
pub(super) unsafe fn tile_portable(
    w: &[bf16],
    np: usize,
    slots: usize,
    (ps, cs): (usize, usize),
    xs: &[f32],
    m: usize,
    dst: Dst,
) {
    let sums = |r: usize, q: usize| {
        let mut acc = [0f32; PANEL];
        for s in 0..slots {
            let (x_odd, x_even) = (xs[(s * m + q) * 2], xs[(s * m + q) * 2 + 1]);
            let lanes = &w[r * ps + s * cs..r * ps + s * cs + 2 * PANEL];
            for (a, pair) in acc.iter_mut().zip(lanes.chunks_exact(2)) {
                let odd = daz(daz(pair[1].to_f32()).mul_add(daz(x_odd), *a));
                *a = daz(daz(pair[0].to_f32()).mul_add(daz(x_even), odd));
            }
        }
        acc
    };
    // SAFETY: by the caller's contract.
    unsafe { dst.put_each(m, np, sums) };
}

/// The panel index of column `k`, lane `j` for an element type storing `T::PAIR` columns per
/// slot.
#[inline(always)]
pub(super) fn slot_index<T: PanelElem>(k: usize, j: usize) -> usize {
    (k / T::PAIR) * T::PAIR * PANEL + j * T::PAIR + k % T::PAIR
}

/// Values of one panel of `cols` columns (whole slots).
#[inline(always)]
pub(super) fn panel_len<T: PanelElem>(cols: usize) -> usize {
    cols.div_ceil(T::PAIR) * T::PAIR * PANEL
}
