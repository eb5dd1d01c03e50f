//! What the x86 bodies of both formats share: the weight-stream prefetch, the walk over a
//! call's rows in tiles, the store of a tile's outputs, and the two encodings of `vpdpbusd`
//! (AVX-512 VNNI and AVX-VNNI) behind one trait, so that one VNNI body serves both.

use std::arch::x86_64::*;

use super::rule::GROUP;

/// How far ahead (bytes) of the block being read the kernels prefetch the weight stream.
const PREFETCH_AHEAD: usize = 2048;

/// How far ahead along the pair walk the AVX-512 bodies prefetch, in each of its two streams
/// ([`Operands::pair_ahead`], where it was measured).
const PAIR_AHEAD: usize = 4096;

/// Prefetch into L1 every cache line of the `bytes` that start [`PREFETCH_AHEAD`] bytes past
/// `at` (a hint: it never faults, so the span may lie past the weights' end). The weights are
/// one forward stream, group after group; the hardware prefetchers alone fell behind it. The
/// AMX body runs it per block; the bodies that walk one group at a time spread the same lines
/// over their block loop ([`prefetch_step`]; on the EPYC below, AVX2's Q8_0 and Q4_K rows lost
/// 10-25% with `prefetcht1`), and the AVX-512 ones walk two ([`Operands::pair_ahead`]).
#[inline(always)]
pub(crate) fn prefetch_ahead<T>(at: *const T, bytes: usize) {
    let at = at.cast::<i8>().wrapping_add(PREFETCH_AHEAD);
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch reads nothing architecturally and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line)) };
    }
}

/// [`prefetch_ahead`] of `block`'s lines (a `T`), spread over the `steps` steps of a body's
/// block loop: step `i`'s share ([`step_lines`]; why: [`PairAhead::step`]). On the EPYC there
/// (DRAM ring, 5 interleaved rounds, medians, against all lines at the block's start), the
/// AVX2 bodies' 1-row products: Q4_K 21.4 -> 22.1 GiB/s, Q8_0 26.3 -> 28.5, Q6_K 9.8 -> 20.6;
/// 9 rows the same or better.
#[inline(always)]
pub(crate) fn prefetch_step<T>(block: *const T, i: usize, steps: usize) {
    let at = block.cast::<i8>().wrapping_add(PREFETCH_AHEAD);
    for line in step_lines(std::mem::size_of::<T>().div_ceil(64), i, steps) {
        // SAFETY: a prefetch reads nothing architecturally and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * line)) };
    }
}

/// Step `i`'s share of a block's `lines` over `steps` steps: `lines / steps` a step (rounded
/// up), from the first step on.
#[inline(always)]
fn step_lines(lines: usize, i: usize, steps: usize) -> std::ops::Range<usize> {
    let per = lines.div_ceil(steps);
    (i * per).min(lines)..((i + 1) * per).min(lines)
}

/// One call's operands, as each of its tiles reads them: the weight's group-blocks (`blocks`
/// a group), the quantized activations, and the outputs `o0 .. o0 + width` it writes.
pub(crate) struct Operands<'a, W, X> {
    weight: &'a [W],
    blocks: usize,
    /// The activations.
    pub x: &'a X,
    o0: usize,
    width: usize,
}

impl<'a, W, X> Operands<'a, W, X> {
    /// A call over `n` rows writing `out_len` outputs (`n` rows of `out_len / n`) from output
    /// `o0` (a multiple of [`GROUP`]).
    pub(crate) fn new(
        weight: &'a [W],
        blocks: usize,
        x: &'a X,
        n: usize,
        o0: usize,
        out_len: usize,
    ) -> Self {
        let width = out_len / n.max(1);
        Self {
            weight,
            blocks,
            x,
            o0,
            width,
        }
    }

    /// Where to prefetch, for a body that walks groups `g` and `g + 1` side by side (block `b`
    /// of both, then the next): the lines of both streams [`PAIR_AHEAD`] bytes further along
    /// that walk. Past a group's end it goes on at groups `g + 2` and `g + 3`, which the pair
    /// after reads (a plain look-ahead from each group would fetch `g + 2` twice and `g + 3`
    /// never). The body prefetches them over its block loop ([`PairAhead::step`]).
    ///
    /// Measured on an EPYC (Zen 4, AVX-512 VNNI, 2 threads; DRAM ring of the memory-bound
    /// pair's MLP matrices, 2 interleaved runs), all lines at the block's start, against
    /// [`prefetch_ahead`] per group:
    /// Q4_K 1 row 13.4-15.7 -> 20.5-21.0 GiB/s, 9 rows 7.0-8.4 -> 9.0-10.9; Q8_0 9 rows
    /// 16.0 -> 17.2-18.7. Most of it is the hint: the AVX-512 packed tiles found the same
    /// (`packed::x86::TO_L2`). The pair-aware addresses with `prefetcht0` gained nothing. End
    /// to end, the pair's Q4_K target forward went from 22-23 to 14-15.6 ms (1 row) and
    /// 40-43 to 32-33 ms (9 rows), Q8_0 from 26-30 to 23 and 38-40 to 31-33; then 4 KiB ahead
    /// in place of 2 (3 interleaved runs; 8 KiB fell between): Q8_0 9 rows 29-31 ms where 2 KiB
    /// gave 34-38, Q4_K 9 rows 31-34 against 34-35.
    #[inline(always)]
    pub(crate) fn pair_ahead(&self, g: usize, b: usize) -> PairAhead {
        let size = std::mem::size_of::<W>();
        let group = self.blocks * size;
        let p = b * size + PAIR_AHEAD;
        let (pairs, off) = (p / group, p % group);
        let base = self.weight.as_ptr().cast::<i8>();
        PairAhead {
            at: [0, 1].map(|s| base.wrapping_add((g + s + 2 * pairs) * group + off)),
            left: group - off,
            group,
            lines: size.div_ceil(64),
        }
    }

    /// Group `g`'s blocks.
    #[inline(always)]
    pub(crate) fn group(&self, g: usize) -> &'a [W] {
        &self.weight[g * self.blocks..][..self.blocks]
    }

    /// The groups of the call's outputs.
    pub(crate) fn groups(&self) -> std::ops::Range<usize> {
        self.o0 / GROUP..(self.o0 + self.width).div_ceil(GROUP)
    }
}

/// A block's look-ahead in both streams of a pair walk ([`Operands::pair_ahead`]).
pub(crate) struct PairAhead {
    /// Where the look-ahead starts in each stream.
    at: [*const i8; 2],
    /// Bytes from there to the group's end, past which each stream goes on two groups on.
    left: usize,
    /// Bytes of a group.
    group: usize,
    /// Lines of a block.
    lines: usize,
}

impl PairAhead {
    /// Prefetch into L2 (`prefetcht1`) step `i`'s share ([`step_lines`]) of the block's lines
    /// in both streams, for a body whose block loop has `steps` steps.
    ///
    /// Spread, not in one burst at the block's start: the burst (18-54 prefetches) fills the
    /// core's miss queue ahead of the block's own loads, and the loop after it issues none
    /// (a reading of the numbers below; this VM exposes no counters to confirm it).
    /// On the EPYC above (DRAM ring, 6 interleaved rounds, medians, against the burst): Q4_K 1
    /// row 22.5 -> 26.0 GiB/s, 9 rows 10.7 -> 12.1; Q6_K 19.0 -> 25.4 and 9.7 -> 11.7; Q8_0 26.9
    /// -> 28.1 and 19.5 -> 23.7. The pair's in-place Q4_K target forward (engine bench, 4
    /// rounds twice): 1 row 13.4-14.9 -> 12.4-12.5 ms, 9 rows 33.6 -> 30.8-32.2, 48 rows equal
    /// (174 against 165 ms, 6 rounds). Two partial-sum chains for 1-2 row tiles gained nothing.
    #[inline(always)]
    pub(crate) fn step(&self, i: usize, steps: usize) {
        for line in step_lines(self.lines, i, steps) {
            // A block's lines run past the group's end at most once (a group holds a block).
            let off = 64 * line
                + if 64 * line >= self.left {
                    self.group
                } else {
                    0
                };
            for at in self.at {
                // SAFETY: a prefetch reads nothing architecturally and never faults.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(off)) };
            }
        }
    }
}

/// A call's `n` rows in as few tiles as the largest size allows, of near-equal sizes (9 rows
/// at most 8 a tile: 5 and 4, not 8 and a 1-row tile that redoes the group's unpacking for one
/// row): `tiles!(n, [1, 2, 4], |r, R| tile::<R>(…, r))` runs the body for each tile with its
/// first row `r` and its size `R` (a const, for const generics).
macro_rules! tiles {
    ($n:expr, [$($k:literal),+], |$r:ident, $R:ident| $body:expr) => {{
        const MAX: usize = { let s = [$($k),+]; s[s.len() - 1] };
        let mut $r = 0;
        while $r < $n {
            let len = ($n - $r).div_ceil(($n - $r).div_ceil(MAX));
            match len {
                $($k => {
                    const $R: usize = $k;
                    $body
                })+
                _ => unreachable!("tile sizes run 1 ..= {MAX}"),
            }
            $r += len;
        }
    }};
}
pub(crate) use tiles;

/// Define `unsafe fn $name(op, n, out)`, one x86 body of a format's product
/// ([`super::group::X86Body`]): with `$features` enabled, every group of the call's outputs in
/// tiles of the listed row counts ([`tiles!`]), `$tile` run on each with the tile's group `g`,
/// first row `r` and size `R`.
///
/// The body's contract (its `# Safety`): the CPU has `$features`; `op` covers `n` rows, its
/// weight every group of its outputs (from a multiple of [`GROUP`]) and its activations `n`
/// rows of the weight's width.
macro_rules! group_body {
    ($(#[$doc:meta])* $name:ident($W:ty, $X:ty), $features:literal, [$($k:literal),+],
     |$op:ident, $out:ident, $g:ident, $r:ident, $R:ident| $tile:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// See [`crate::nn::quant::simd::group_body`].
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name($op: &Operands<'_, $W, $X>, n: usize, $out: &mut [f32]) {
            // SAFETY: by this function's contract, for the rows each call covers.
            unsafe {
                for $g in $op.groups() {
                    $crate::nn::quant::simd::tiles!(n, [$($k),+], |$r, $R| $tile);
                }
            }
        }
    };
}
pub(crate) use group_body;

/// [`group_body!`] for AVX-512 VNNI bodies on two groups at once: `$pair` runs the tile of
/// groups `g` and `g + 1`, `$single` a call's unpaired last group.
macro_rules! pair_body {
    ($(#[$doc:meta])* $name:ident($W:ty, $X:ty), [$($k:literal),+],
     |$op:ident, $out:ident, $g:ident, $r:ident, $R:ident| $pair:expr, $single:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// See [`crate::nn::quant::simd::group_body`]; AVX-512 F, VL, BW and VNNI, AVX2, FMA
        /// and F16C.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        pub(crate) unsafe fn $name($op: &Operands<'_, $W, $X>, n: usize, $out: &mut [f32]) {
            let all = $op.groups();
            // SAFETY: by this function's contract, for the rows and groups each call covers.
            unsafe {
                for $g in all.clone().step_by(2) {
                    if $g + 1 < all.end {
                        $crate::nn::quant::simd::tiles!(n, [$($k),+], |$r, $R| $pair);
                    } else {
                        $crate::nn::quant::simd::tiles!(n, [$($k),+], |$r, $R| $single);
                    }
                }
            }
        }
    };
}
pub(crate) use pair_body;

/// Write a tile's accumulators (lane `j` of row `t`'s: output `8g + j` of row `r + t`) into
/// `out` (`[n, width]`: the call's outputs), lanes past the outputs dropped; `L` lanes a vector
/// (8, or 16 for two groups side by side).
#[inline(always)]
pub(crate) fn store<V: Copy, const L: usize, const R: usize, W, X>(
    acc: &[V; R],
    op: &Operands<'_, W, X>,
    (g, r): (usize, usize),
    out: &mut [f32],
) {
    const { assert!(std::mem::size_of::<V>() == 4 * L) };
    let (first, width) = (g * GROUP - op.o0, op.width);
    let take = L.min(width - first);
    for (t, a) in acc.iter().enumerate() {
        // SAFETY: `V` is `L` floats (checked above), any bit pattern a float.
        let lanes: [f32; L] = unsafe { std::mem::transmute_copy(a) };
        out[(r + t) * width + first..][..take].copy_from_slice(&lanes[..take]);
    }
}

/// The 4 bytes at `p`, in every 32-bit lane.
///
/// # Safety
/// `p` points at 4 readable bytes.
#[inline(always)]
pub(crate) unsafe fn broadcast4(p: *const i8) -> __m256i {
    // SAFETY: by the contract; AVX is enabled wherever this is inlined (every caller is an
    // AVX2 body).
    unsafe { _mm256_set1_epi32(p.cast::<i32>().read_unaligned()) }
}

/// `vpdpbusd`: lane `i` of `acc` plus the 4 products of lane `i`'s unsigned bytes of `u` and
/// signed bytes of `s` (no saturation).
pub(crate) trait Dpbusd {
    /// `acc + Σ u8(u) · i8(s)` per 32-bit lane.
    ///
    /// # Safety
    /// The CPU has the instruction's extension, and the caller enables it.
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
}

/// The EVEX form (AVX-512 VNNI with VL): 32 vector registers.
pub(crate) struct Avx512Vnni;

impl Dpbusd for Avx512Vnni {
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: by the contract, AVX-512 VNNI and VL are enabled here.
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }
}

/// The VEX form (AVX-VNNI): 16 vector registers.
pub(crate) struct AvxVnni;

impl Dpbusd for AvxVnni {
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: by the contract, AVX-VNNI is enabled here.
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, s) }
    }
}

#[cfg(test)]
mod tests {
    use super::step_lines;

    #[test]
    fn the_steps_share_every_line_once_in_order() {
        for lines in 1..64 {
            for steps in 1..40 {
                let all: Vec<usize> = (0..steps)
                    .flat_map(|i| step_lines(lines, i, steps))
                    .collect();
                assert_eq!(
                    all,
                    (0..lines).collect::<Vec<_>>(),
                    "{lines} lines, {steps} steps"
                );
            }
        }
    }
}
