//! The AMX body of the Q8_0 product ([`super::QuantKernel::Amx`]): each block's integer sums
//! from `tdpbssd` tiles, scaled and added by AVX-512 as the 512-bit body (`zmm.rs`) adds its own,
//! so the bits are the rule's.
//!
//! A group-block's 8 words of 32 bytes (word `k`: bytes `4k .. 4k + 4` of its 8 rows) are
//! AMX's B layout as they lie: 8 rows of 8 × 4 signed bytes, one B tile at a 32-byte stride.
//! Block `b` of up to 16 activation rows is one A tile (each row's 32 bytes, at the rows'
//! stride). One `tdpbssd` per group gives every row's 8 exact block sums `Σ w · x` (signed by
//! signed, no offset), and two C tiles stored side by side (rows of 64 bytes) give each row the
//! 16 sums of two groups in one vector: widened, scaled by `f32(d_w) · d_x` and added with one
//! fused multiply-add, as the rule says, block after block.
//!
//! **From how many rows.** A `tdpbssd` holds the tile unit about as long whatever its shape,
//! and a Q8_0 group-block fills a quarter of one (32 of its 64 bytes of depth, 8 of its 16
//! columns), so the two per group pair and block cost a fixed ~30 cycles: below
//! [`MIN_ROWS`] rows the 512-bit body (`vpdpbusd` on two ports) is faster, and a call runs it.
//! From there (a prefill's rows) the tiles run 1.2–1.3x its rate (one thread, cache-resident,
//! a Sapphire Rapids Xeon). Full tiles would need two groups' words side by side in memory:
//! building them with vector stores stalls the tile loads that read them (5x slower, measured),
//! so that takes 16-row groups in the stored layout.
//!
//! Tiles run up to 16 rows, of near-equal sizes ([`simd::tiles!`]); one configuration serves a
//! call: its largest tile's rows, a smaller tile reading the row before it too (its sums
//! dropped). A call's unpaired last group runs as its own pair.

use std::arch::x86_64::*;

use super::acts::QuantRows;
use super::rule::{BLOCK, GROUP, GroupQ8};
use super::simd::{self, Operands, prefetch_ahead, store};
use super::zmm::pair_f16;
use crate::cpu::amx::{self, Config, Unit, load, release};

/// Rows of an A or C tile at most.
const TILE: usize = 16;

/// Rows from which a call runs the tiles; fewer run the 512-bit body (`zmm.rs`), faster there.
pub(super) const MIN_ROWS: usize = 12;

/// Bytes of a C tile's row: a group's 8 sums.
const C_BYTES: usize = 4 * GROUP;

/// Whether this process runs the int8 tiles ([`crate::cpu::amx::available`]).
pub(super) fn available() -> bool {
    amx::available(Unit::Int8)
}

/// `tdpbssd tmm$c, tmm$a, tmm$b`: signed bytes by signed bytes into 32-bit sums.
macro_rules! dp {
    ($c:literal, $a:literal, $b:literal) => {
        ::std::arch::asm!(
            concat!("tdpbssd tmm", $c, ", tmm", $a, ", tmm", $b),
            options(nostack, nomem, preserves_flags)
        )
    };
}

/// `tilezero tmm$t`.
macro_rules! zero {
    ($t:literal) => {
        ::std::arch::asm!(
            concat!("tilezero tmm", $t),
            options(nostack, nomem, preserves_flags)
        )
    };
}

/// The configuration for tiles of `rows` rows: B in tmm1 and tmm2 (a group-block: 8 words of
/// 32 bytes), and two sets for two blocks in flight: A in tmm0 and tmm5 (a block of each row:
/// `rows` × 32 bytes), C in tmm3, tmm4 and tmm6, tmm7 (`rows` × a group's 8 sums).
fn config(rows: usize) -> Config {
    let mut c = Config::new();
    for t in [1, 2] {
        c.set(t, BLOCK / 4, C_BYTES);
    }
    for t in [0, 5] {
        c.set(t, rows, BLOCK);
    }
    for t in [3, 4, 6, 7] {
        c.set(t, rows, C_BYTES);
    }
    c
}

/// One block's sums: row `t`'s two groups' 16 at `[t]`.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Sums([[i32; 2 * GROUP]; TILE]);

/// A block's tiles with set `$a`, `$c0`, `$c1`: A the configured rows from `$x` (at
/// `$stride`), B the two group-blocks `$w0` and `$w1`, into C tiles stored side by side at
/// `$sums` (64-byte rows).
macro_rules! block_sums {
    (
        $a:literal, $c0:literal, $c1:literal,
        $x:expr, $stride:expr, $w0:expr, $w1:expr, $sums:expr
    ) => {{
        load!($a, $x, $stride);
        load!(1, $w0.qs.as_ptr(), C_BYTES);
        load!(2, $w1.qs.as_ptr(), C_BYTES);
        zero!($c0);
        zero!($c1);
        dp!($c0, $a, 1);
        dp!($c1, $a, 2);
        let c: *mut u8 = $sums;
        amx::store!($c0, c, 2 * C_BYTES);
        amx::store!($c1, c.add(C_BYTES), 2 * C_BYTES);
    }};
}

/// Groups `g` and `h` (`g + 1`, or `g` again for an unpaired last group) of rows
/// `r .. r + R` into `out`, with tiles configured for `rows ≥ R` rows (the A tiles start
/// `rows − R` rows early). Block `b + 1`'s tiles run while block `b`'s sums are added.
///
/// # Safety
/// AVX-512 F and F16C enabled, the int8 tiles [`available`] and configured by [`config`]`(rows)`
/// with `rows ≤ r + R`; `weight` holds groups `g` and `h`'s blocks and `x` rows `0 .. r + R`.
#[inline(always)]
unsafe fn pair_tile<const R: usize>(
    op: &Operands<'_, GroupQ8, QuantRows>,
    out: &mut [f32],
    (g, h): (usize, usize),
    r: usize,
    rows: usize,
    sums: &mut [Sums; 2],
) {
    let (w0, w1) = (op.group(g), op.group(h));
    let xd: [&[f32]; R] = std::array::from_fn(|t| op.x.row(r + t).0);
    let skip = rows - R;
    let stride = op.x.blocks * BLOCK;
    let a = op.x.qs[(r - skip) * stride..].as_ptr();
    // Written by the tile stores and read by the vector loads: one mutable provenance.
    let base = sums.as_mut_ptr();
    let stash = |i: usize| base.wrapping_add(i % 2).cast::<u8>();
    // SAFETY (every instruction below): the caller's contract: the tiles read `rows` rows of
    // the activations from row `r − skip` and one group-block each, within bounds, and store
    // `rows` rows of 32 bytes at a 64-byte stride into `sums`.
    unsafe {
        let issue = |b: usize| {
            let (x, q0, q1) = (a.add(b * BLOCK), &w0[b], &w1[b]);
            prefetch_ahead(q0, std::mem::size_of::<GroupQ8>());
            prefetch_ahead(q1, std::mem::size_of::<GroupQ8>());
            if b.is_multiple_of(2) {
                block_sums!(0, 3, 4, x, stride, q0, q1, stash(b));
            } else {
                block_sums!(5, 6, 7, x, stride, q0, q1, stash(b));
            }
        };
        let mut acc = [_mm512_setzero_ps(); R];
        issue(0);
        for b in 0..w0.len() {
            if b + 1 < w0.len() {
                issue(b + 1);
            }
            let dw = pair_f16(&w0[b].d, &w1[b].d);
            let at = stash(b).cast::<[i32; 2 * GROUP]>();
            for (t, xd) in xd.iter().enumerate() {
                let isum = _mm512_load_si512(at.add(skip + t).cast());
                // `d_w · d_x` rounded once, per output.
                let s = _mm512_mul_ps(dw, _mm512_set1_ps(xd[b]));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, acc[t]);
            }
        }
        store::<_, 16, R, _, _>(&acc, op, (g, r), out);
    }
}

/// The rule's product with AMX-INT8 tiles and AVX-512: the same bits.
///
/// # Safety
/// See [`crate::nn::quant::simd::group_body`]; AVX-512 F, VL, BW and VNNI, AVX2, FMA, F16C,
/// and the int8 tiles [`available`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(crate) unsafe fn matmul_rows(op: &Operands<'_, GroupQ8, QuantRows>, n: usize, out: &mut [f32]) {
    if n < MIN_ROWS {
        // SAFETY: this function's extensions include the 512-bit body's.
        unsafe { super::zmm::matmul_rows(op, n, out) };
        return;
    }
    // The largest tile of `tiles!` (its first): every tile's A reads this many rows.
    let rows = n.div_ceil(n.div_ceil(TILE));
    let mut sums = [Sums([[0; 2 * GROUP]; TILE]); 2];
    let all = op.groups();
    // SAFETY: the tiles are available by this function's contract and configured here for
    // `rows` rows; a tile of `R ≤ rows` rows ends at `r + R ≥ rows`, so its A reads rows from
    // `r + R − rows ≥ 0`; `tilerelease` ends the tile state.
    unsafe {
        config(rows).load();
        for g in all.clone().step_by(2) {
            let pair = (g, if g + 1 < all.end { g + 1 } else { g });
            simd::tiles!(
                n,
                [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
                |r, R| pair_tile::<R>(op, out, pair, r, rows, &mut sums)
            );
        }
        release();
    }
}
