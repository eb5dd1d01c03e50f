//! The x86 tiles of bf16 pair panels ([`super::pairs`]): `vdpbf16ps` (AVX512-BF16), and the
//! AVX-512F and AVX2 tiles that widen each pair in registers, check the MXCSR flags and their
//! accumulators, and fall back to [`exact256`] where a subnormal met the rule.

use std::arch::asm;
use std::arch::x86_64::*;

use half::bf16;

use super::dst::Dst;
use super::x86::{TO_L1, TO_L2, prefetch_ahead, put256, put512};
use super::{Kernel, PANEL};

/// MXCSR's default: round to nearest even, no DAZ or FTZ, every exception masked.
const MXCSR_DEFAULT: u32 = 0x1f80;
/// MXCSR status flags: denormal operand, underflow.
const DENORMAL_OR_UNDERFLOW: u32 = 0x02 | 0x10;
/// The bits of a bf16 pair word's odd (top) value.
const TOP: i32 = 0xffff_0000_u32 as i32;
/// All but the sign.
const MAGNITUDE: i32 = 0x7fff_ffff;

/// Run the widening tile `f` with MXCSR in its default state and its flags cleared (then
/// restored); `true` when `f` reported clean accumulators and raised neither a denormal
/// operand nor an underflow, so its plain FMAs gave the rule's bits.
///
/// The `asm!` blocks are memory barriers (no `nomem`), and `f` reads its operands from
/// memory and writes its sums to memory, so the compiler keeps its arithmetic between them.
#[inline(always)]
fn guarded(f: impl FnOnce() -> bool) -> bool {
    let (mut saved, mut after, default) = (0u32, 0u32, MXCSR_DEFAULT);
    // SAFETY: `stmxcsr` / `ldmxcsr` of a valid MXCSR value through a live local.
    unsafe {
        asm!("stmxcsr [{}]", in(reg) &raw mut saved, options(nostack, preserves_flags));
        asm!("ldmxcsr [{}]", in(reg) &raw const default, options(nostack, preserves_flags));
    }
    let clean = f();
    // SAFETY: as above.
    unsafe {
        asm!("stmxcsr [{}]", in(reg) &raw mut after, options(nostack, preserves_flags));
        asm!("ldmxcsr [{}]", in(reg) &raw const saved, options(nostack, preserves_flags));
    }
    clean && after & DENORMAL_OR_UNDERFLOW == 0
}

/// `m` rows × `np` panels (see [`super::pairs::tile`]; `slots` column pairs).
///
/// # Safety
/// `kernel` runs on this CPU; the rest as [`super::pairs::tile`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile(
    kernel: Kernel,
    w: &[bf16],
    np: usize,
    slots: usize,
    strides: (usize, usize),
    xs: &[f32],
    m: usize,
    dst: Dst,
) {
    macro_rules! shapes {
        ($f:ident, $($m:literal),*) => {
            match (m, np) {
                $(
                    ($m, 4) => $f::<$m, 4>(w, slots, strides, xs, dst),
                    ($m, 3) => $f::<$m, 3>(w, slots, strides, xs, dst),
                    ($m, 2) => $f::<$m, 2>(w, slots, strides, xs, dst),
                    ($m, _) => $f::<$m, 1>(w, slots, strides, xs, dst),
                )*
                _ => unreachable!("a tile has 1 to 12 rows"),
            }
        };
    }
    // SAFETY (every arm): the kernel runs on this CPU, shapes by the caller's contract.
    let clean = match kernel {
        Kernel::Avx512Bf16 => unsafe {
            shapes!(dp512, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
            true
        },
        Kernel::Avx512 => {
            guarded(|| unsafe { shapes!(widen512, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12) })
        }
        _ => guarded(|| unsafe {
            match m {
                1 => widen256::<1>(w, slots, strides, xs, dst),
                2 => widen256::<2>(w, slots, strides, xs, dst),
                3 => widen256::<3>(w, slots, strides, xs, dst),
                4 => widen256::<4>(w, slots, strides, xs, dst),
                5 => widen256::<5>(w, slots, strides, xs, dst),
                _ => widen256::<6>(w, slots, strides, xs, dst),
            }
        }),
    };
    if !clean {
        for r in 0..np {
            // SAFETY: AVX2 and FMA come with every kernel here; panel `r` of the tile.
            unsafe { exact256(w, m, r, np, slots, strides, xs, dst) };
        }
    }
}

/// The slot × panel walk of the 512-bit tiles ([`dp512`], [`widen512`], in a `#[target_feature]`
/// body with `M` rows and `R` panels in scope): the `M × R` accumulators `$acc`, zeroed, then
/// `$step` for each slot `$s` and panel `$r` with `$v` the 64 bytes of that panel's slot
/// (`w` at `r·ps + s·cs`, prefetched ahead to L2); the accumulators are its value.
macro_rules! walk512 {
    ($w:ident, $slots:ident, ($ps:ident, $cs:ident), |$acc:ident, $s:ident, $r:ident, $v:ident| $step:block) => {{
        let wp = $w.as_ptr();
        let mut $acc = [[_mm512_setzero_ps(); R]; M];
        for $s in 0..$slots {
            for $r in 0..R {
                let at = wp.wrapping_add($r * $ps + $s * $cs).cast::<i8>();
                prefetch_ahead::<TO_L2>(at);
                // SAFETY: `r·ps + s·cs + 32 <= w.len()` by the tile's contract.
                let $v = unsafe { _mm512_loadu_si512(at.cast()) };
                $step
            }
        }
        $acc
    }};
}

/// `M` rows × `R` panels with `vdpbf16ps`; `xs` one word per row and slot.
///
/// # Safety
/// AVX-512F and AVX512-BF16 must be available; `w` holds panel `r`'s slot `s` at
/// `r·ps + s·cs` (32 values), `xs` the `M` rows' words interleaved (`xs[s·M + q]`); `dst`
/// writable for `M` rows × `R` panels.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dp512<const M: usize, const R: usize>(
    w: &[bf16],
    slots: usize,
    (ps, cs): (usize, usize),
    xs: &[f32],
    dst: Dst,
) {
    let xp = xs.as_ptr();
    let acc = walk512!(w, slots, (ps, cs), |acc, s, r, v| {
        // SAFETY: `s·M + q < M·slots`; a bf16 vector is 32 bf16 values in the 64 bytes of an
        // integer one.
        unsafe {
            let v: __m512bh = std::mem::transmute(v);
            for (q, aq) in acc.iter_mut().enumerate() {
                let word = (*xp.add(s * M + q)).to_bits() as i32;
                let xb: __m512bh = std::mem::transmute(_mm512_set1_epi32(word));
                aq[r] = _mm512_dpbf16_ps(aq[r], v, xb);
            }
        }
    });
    // SAFETY: by the caller's contract.
    unsafe { put512(&acc, dst) };
}

/// `M` rows × `R` panels widened with AVX-512F: per slot and panel, the odd column's FMA then
/// the even one's. Returns `false` when an accumulator ends subnormal. `xs` holds
/// `(x_odd, x_even)` per row and slot.
///
/// # Safety
/// AVX-512F must be available; as [`dp512`] with two values per row and slot.
#[target_feature(enable = "avx512f")]
unsafe fn widen512<const M: usize, const R: usize>(
    w: &[bf16],
    slots: usize,
    (ps, cs): (usize, usize),
    xs: &[f32],
    dst: Dst,
) -> bool {
    let xp = xs.as_ptr();
    let top = _mm512_set1_epi32(TOP);
    let acc = walk512!(w, slots, (ps, cs), |acc, s, r, v| {
        let odd = _mm512_castsi512_ps(_mm512_and_si512(v, top));
        let even = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v));
        for (q, aq) in acc.iter_mut().enumerate() {
            // SAFETY: `(s·M + q)·2 + 1 < 2·M·slots`.
            unsafe {
                let x = xp.add((s * M + q) * 2);
                aq[r] = _mm512_fmadd_ps(odd, _mm512_set1_ps(*x), aq[r]);
                aq[r] = _mm512_fmadd_ps(even, _mm512_set1_ps(*x.add(1)), aq[r]);
            }
        }
    });
    let (magnitude, smallest) = (
        _mm512_set1_epi32(MAGNITUDE),
        _mm512_set1_ps(f32::MIN_POSITIVE),
    );
    let mut subnormal = 0u16;
    for a in acc.iter().flatten() {
        let abs = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(*a), magnitude));
        let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(abs, smallest);
        subnormal |= below & _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(abs, _mm512_setzero_ps());
    }
    // SAFETY: by the caller's contract.
    unsafe { put512(&acc, dst) };
    subnormal == 0
}

/// `M` rows × 1 panel widened with AVX2 (two 8-lane halves, 32 bytes each); as [`widen512`].
///
/// # Safety
/// AVX2 and FMA must be available; as [`widen512`] for one panel.
#[target_feature(enable = "avx2,fma")]
unsafe fn widen256<const M: usize>(
    w: &[bf16],
    slots: usize,
    (_, cs): (usize, usize),
    xs: &[f32],
    dst: Dst,
) -> bool {
    let (wp, xp) = (w.as_ptr(), xs.as_ptr());
    let top = _mm256_set1_epi32(TOP);
    let mut acc = [[_mm256_setzero_ps(); 2]; M];
    for s in 0..slots {
        let at = wp.wrapping_add(s * cs).cast::<i8>();
        prefetch_ahead::<TO_L1>(at);
        for h in 0..2 {
            // SAFETY: `s·cs + 32 <= w.len()`, `(s·M + q)·2 + 1 < 2·M·slots`.
            unsafe {
                let v = _mm256_loadu_si256(at.add(32 * h).cast());
                let odd = _mm256_castsi256_ps(_mm256_and_si256(v, top));
                let even = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v));
                for (q, aq) in acc.iter_mut().enumerate() {
                    let x = xp.add((s * M + q) * 2);
                    aq[h] = _mm256_fmadd_ps(odd, _mm256_set1_ps(*x), aq[h]);
                    aq[h] = _mm256_fmadd_ps(even, _mm256_set1_ps(*x.add(1)), aq[h]);
                }
            }
        }
    }
    let mut subnormal = 0;
    for a in acc.iter().flatten() {
        subnormal |= _mm256_movemask_ps(tiny256(*a));
    }
    // SAFETY: by the caller's contract.
    unsafe { put256(&acc, 0, 1, dst) };
    subnormal == 0
}

/// Lanes of `a` that are subnormal (all ones), the rest zero.
#[target_feature(enable = "avx2")]
fn tiny256(a: __m256) -> __m256 {
    let abs = _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(MAGNITUDE)));
    let below = _mm256_cmp_ps::<_CMP_LT_OQ>(abs, _mm256_set1_ps(f32::MIN_POSITIVE));
    _mm256_and_ps(
        below,
        _mm256_cmp_ps::<_CMP_NEQ_OQ>(abs, _mm256_setzero_ps()),
    )
}

/// `daz` of every lane: a subnormal becomes the zero of its sign.
#[target_feature(enable = "avx2")]
fn daz256(a: __m256) -> __m256 {
    let magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(MAGNITUDE));
    _mm256_andnot_ps(_mm256_and_ps(tiny256(a), magnitude), a)
}

/// Panel `r` of a tile of `m` rows by the rule with every `daz` spelled out (operands and each
/// FMA's result), in MXCSR's default state (so that no DAZ or FTZ of the caller's adds to
/// them, and rounding is to nearest even).
///
/// # Safety
/// AVX2 and FMA must be available; as [`widen256`] for panel `r` of `np`.
#[allow(clippy::too_many_arguments)]
unsafe fn exact256(
    w: &[bf16],
    m: usize,
    r: usize,
    np: usize,
    slots: usize,
    strides: (usize, usize),
    xs: &[f32],
    dst: Dst,
) {
    // The flags are not read: every flush is spelled out.
    // SAFETY: by the caller's contract.
    guarded(|| unsafe {
        exact256_body(w, m, r, np, slots, strides, xs, dst);
        true
    });
}

/// [`exact256`]'s arithmetic.
///
/// # Safety
/// As [`exact256`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn exact256_body(
    w: &[bf16],
    m: usize,
    r: usize,
    np: usize,
    slots: usize,
    (ps, cs): (usize, usize),
    xs: &[f32],
    dst: Dst,
) {
    let top = _mm256_set1_epi32(TOP);
    let mut lanes = [0f32; PANEL];
    for q in 0..m {
        let mut acc = [_mm256_setzero_ps(); 2];
        for s in 0..slots {
            for (h, a) in acc.iter_mut().enumerate() {
                // SAFETY: as in `widen256`, panel `r` at `r·ps`.
                unsafe {
                    let v = _mm256_loadu_si256(w.as_ptr().add(r * ps + s * cs + 16 * h).cast());
                    let odd = daz256(_mm256_castsi256_ps(_mm256_and_si256(v, top)));
                    let even = daz256(_mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)));
                    let x = xs.as_ptr().add((s * m + q) * 2);
                    let (xo, xe) = (_mm256_set1_ps(*x), _mm256_set1_ps(*x.add(1)));
                    *a = daz256(_mm256_fmadd_ps(odd, daz256(xo), *a));
                    *a = daz256(_mm256_fmadd_ps(even, daz256(xe), *a));
                }
            }
        }
        // SAFETY: `lanes` holds 16 values; `dst` by the caller's contract.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
            dst.put(q, r, np, &lanes);
        }
    }
}

/// The words of `row`'s leading whole 32-column chunks (16 slots each), appended to `out` by
/// `vcvtne2ps2bf16`, which rounds as [`super::pairs::round_input`] does except on subnormal
/// inputs (it reads them as zeros, where the rule rounds the largest up to the smallest
/// normal): a chunk holding one is left to the caller. Returns the columns done.
///
/// # Safety
/// AVX-512F and AVX512-BF16 must be available.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(super) unsafe fn words512(row: &[f32], out: &mut Vec<f32>) -> usize {
    let (exponent, mantissa) = (
        _mm512_set1_epi32(0x7f80_0000),
        _mm512_set1_epi32(0x007f_ffff),
    );
    let subnormal = |v: __m512| {
        let bits = _mm512_castps_si512(v);
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, exponent), _mm512_setzero_si512())
            & _mm512_test_epi32_mask(bits, mantissa)
    };
    let mut done = 0;
    out.reserve(row.len() / 2);
    for chunk in row.chunks_exact(32) {
        // SAFETY: 32 values in `chunk`.
        let (lo, hi) = unsafe {
            (
                _mm512_loadu_ps(chunk.as_ptr()),
                _mm512_loadu_ps(chunk.as_ptr().add(16)),
            )
        };
        if subnormal(lo) | subnormal(hi) != 0 {
            break;
        }
        // 32 bf16 values in column order: each pair (even, odd) is one little-endian word.
        // SAFETY: a bf16 vector is the 64 bytes of an integer one.
        let words: __m512i = unsafe { std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo)) };
        let at = out.len();
        // SAFETY: `reserve` above left room for every chunk's 16 words.
        unsafe {
            _mm512_storeu_si512(out.as_mut_ptr().add(at).cast(), words);
            out.set_len(at + 16);
        }
        done += 32;
    }
    done
}
