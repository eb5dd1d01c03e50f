//! AMX tiles for bf16 pair panels ([`super::pairs`]): `tdpbf16ps` on Intel CPUs with AMX-BF16
//! (Sapphire Rapids and later), [`super::Kernel::Amx`].
//!
//! A bf16 panel's slots are already AMX's B-operand layout: slot `s` holds the 16 lanes' column
//! pairs `(2s, 2s + 1)` in 64 bytes, so 16 consecutive slots of a panel are one B tile (16 rows
//! of 64 bytes), loaded where they lie at the panel's slot stride. The activations are the
//! same rounded bf16 pairs as `vdpbf16ps` reads, one word per slot, row-major (row `q`'s slot
//! `s` at `xs[q·slots + s]`): 16 slots of up to 16 rows are one A tile. A C tile holds 16 rows ×
//! 16 lanes of f32 sums, so a tile runs up to 16 rows × 4 panels or 32 rows × 2 panels (the
//! eight tile registers: four C, one or two A, two or three B), in steps of 16 slots (32
//! columns); a last partial step reconfigures the A and B tiles to its width.
//!
//! **The bits.** One `tdpbf16ps` adds 32 products per output, rounding as the AMX unit does,
//! which is not the `vdpbf16ps` rule the other kernels share (`pairs.rs`): on the same inputs
//! the sums differ in the last bits (measured here: about 1 output in 2, by an ulp or two per
//! step). They are deterministic and each output depends only on its row and its panel, never
//! on how many rows the product has or where a row sits in its tile, so on an AMX machine a
//! one-row decode, a nine-row verification and a prefill give each row the same bits, and
//! speculative greedy decoding equals target-only greedy decoding, as on every other kernel.
//! Across machines, an AMX CPU's sums are its own: `DSPARK_AMX=0` turns the kernel off
//! (`vdpbf16ps` then runs, with the bits of every other machine).
//!
//! **Why.** A `vdpbf16ps` core peaks at tens of GFLOP/s, which caps a prefill and makes a
//! nine-row verification cost nearly twice a one-row decode step of a 0.6 B model; the AMX
//! unit multiplies an order of magnitude faster, so both run at the weights' read rate.
//!
//! Whether the process may run tiles, their configuration and their loads and stores are
//! `cpu/amx.rs`'s.

use std::arch::asm;

use half::bf16;

use super::PANEL;
use super::dst::Dst;
use crate::cpu::amx::{Config, Unit, load, release, store};

/// Slots (column pairs) per `tdpbf16ps`: a B tile's rows, an A tile's 64 bytes of words.
const STEP: usize = 16;

/// Rows of an A or C tile.
const BLOCK: usize = 16;

/// Rows a tile runs at most (two row blocks).
pub(super) const MAX_ROWS: usize = 2 * BLOCK;

/// Whether this process runs the bf16 tiles ([`crate::cpu::amx::available`]).
pub(super) fn available() -> bool {
    crate::cpu::amx::available(Unit::Bf16)
}

/// The configuration of a step of `width` slots for `rows` rows (one or two row blocks):
/// C tiles `0 .. 4` (four panels of one block, or two panels of each of two), the A tiles
/// after them (a block's rows × `4·width` bytes), the B tiles last (`width` rows × 64
/// bytes).
fn step_config(rows: usize, width: usize) -> Config {
    let mut c = Config::new();
    let blocks = rows.div_ceil(BLOCK);
    let per_block = if blocks == 1 { 4 } else { 2 };
    for b in 0..blocks {
        let r = (rows - b * BLOCK).min(BLOCK);
        for p in 0..per_block {
            c.set(b * per_block + p, r, 64);
        }
        c.set(4 + b, r, 4 * width);
    }
    for t in 4 + blocks..8 {
        c.set(t, width, 64);
    }
    c
}

/// `tdpbf16ps tmm$c, tmm$a, tmm$b`.
macro_rules! dp {
    ($c:literal, $a:literal, $b:literal) => {
        asm!(
            concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b),
            options(nostack, nomem, preserves_flags)
        )
    };
}

/// The C tiles' sums as stored between steps and at the end: tile `t`, row `q`, lane `j` at
/// `[t][q·16 + j]` (left uninitialized: a store of the tiles writes every row that is read).
type Sums = [[f32; BLOCK * PANEL]; 4];

/// `$op!(t, sums + 256·t, 64)` for C tiles `t` in `0 .. $count` (`$op`: [`load`] or
/// [`store`]).
macro_rules! c_tiles {
    ($op:ident, $sums:expr, $count:expr) => {{
        let (sums, count, s) = ($sums, $count, 64usize);
        let at = |t: usize| sums.wrapping_add(t * BLOCK * PANEL);
        $op!(0, at(0), s);
        if count > 1 {
            $op!(1, at(1), s);
        }
        if count > 2 {
            $op!(2, at(2), s);
        }
        if count > 3 {
            $op!(3, at(3), s);
        }
    }};
}

/// Store C tiles `0 .. count` to `sums` (64-byte rows, tile `t` at `sums + 256·t`).
///
/// # Safety
/// [`available`], with a configuration loaded; `sums` writable for `count` tiles.
#[inline(always)]
unsafe fn store_sums(sums: *mut f32, count: usize) {
    // SAFETY: each tile has at most 16 rows of 64 bytes, the size of a tile's part of `sums`.
    unsafe { c_tiles!(store, sums, count) }
}

/// Load C tiles `0 .. count` from `sums`.
///
/// # Safety
/// As [`store_sums`], the tiles' rows written by it.
#[inline(always)]
unsafe fn load_sums(sums: *const f32, count: usize) {
    // SAFETY: as in `store_sums`.
    unsafe { c_tiles!(load, sums, count) }
}

/// The operands of one step: the A rows and the B panels.
#[derive(Clone, Copy)]
struct Step {
    /// Row 0's first word of the step, and the bytes between rows.
    a: *const f32,
    a_stride: usize,
    /// Panel 0's first slot of the step, the bytes between slots and between panels.
    b: *const bf16,
    b_stride: usize,
    panel_bytes: usize,
}

impl Step {
    /// Panel `r`'s B tile.
    #[inline(always)]
    fn b(&self, r: usize) -> *const u8 {
        self.b.cast::<u8>().wrapping_add(r * self.panel_bytes)
    }

    /// Row block `i`'s A tile.
    #[inline(always)]
    fn a(&self, i: usize) -> *const u8 {
        self.a.cast::<u8>().wrapping_add(i * BLOCK * self.a_stride)
    }
}

/// One step of one row block × `R` panels: A in tmm4, B alternating in tmm5 / tmm6, C tiles
/// `0 .. R`.
///
/// # Safety
/// [`available`], configured by [`Config::step`] for one block; the operands in bounds.
#[inline(always)]
unsafe fn step_one<const R: usize>(s: Step) {
    let (sa, sb) = (s.a_stride, s.b_stride);
    // SAFETY: by the caller's contract.
    unsafe {
        load!(4, s.a(0), sa);
        load!(5, s.b(0), sb);
        dp!(0, 4, 5);
        if R > 1 {
            load!(6, s.b(1), sb);
            dp!(1, 4, 6);
        }
        if R > 2 {
            load!(5, s.b(2), sb);
            dp!(2, 4, 5);
        }
        if R > 3 {
            load!(6, s.b(3), sb);
            dp!(3, 4, 6);
        }
    }
}

/// One step of two row blocks × `R` panels: A in tmm4 / tmm5, B in tmm6 / tmm7, block `i`'s
/// panel `r` in C tile `2i + r`.
///
/// # Safety
/// As [`step_one`], configured for two blocks.
#[inline(always)]
unsafe fn step_two<const R: usize>(s: Step) {
    let (sa, sb) = (s.a_stride, s.b_stride);
    // SAFETY: by the caller's contract.
    unsafe {
        load!(4, s.a(0), sa);
        load!(5, s.a(1), sa);
        load!(6, s.b(0), sb);
        dp!(0, 4, 6);
        dp!(2, 5, 6);
        if R > 1 {
            load!(7, s.b(1), sb);
            dp!(1, 4, 7);
            dp!(3, 5, 7);
        }
    }
}

/// Prefetch (into L2) the B tiles `AHEAD` steps past `s`, one line per slot of each of `np`
/// panels.
#[inline(always)]
fn prefetch(s: &Step, np: usize) {
    use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
    /// Steps ahead: 2 KiB of a contiguous panel, as the other x86 tiles.
    const AHEAD: usize = 2;
    for r in 0..np {
        let at = s.b(r).wrapping_add(AHEAD * STEP * s.b_stride);
        for k in 0..STEP {
            // SAFETY: a prefetch never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(k * s.b_stride).cast()) };
        }
    }
}

/// `m` rows × `np` panels (`m ≤ 16` and `np ≤ 4`, or `m ≤ 32` and `np ≤ 2`) into `dst`.
///
/// # Safety
/// [`available`]; `w` holds panel `r`'s slot `s` at `r·ps + s·cs` (32 values) for `r < np`,
/// `s < slots`; `xs` holds the `m` rows' words row-major (`xs[q·slots + s]`); `dst` writable
/// for `m` rows × `np` panels (see [`Dst`]).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn tile(
    w: &[bf16],
    np: usize,
    slots: usize,
    (ps, cs): (usize, usize),
    xs: &[f32],
    m: usize,
    dst: Dst,
) {
    let blocks = m.div_ceil(BLOCK);
    let most_panels = if blocks == 1 { 4 } else { 2 };
    debug_assert!((1..=MAX_ROWS).contains(&m) && (1..=most_panels).contains(&np));
    debug_assert!(xs.len() == m * slots && slots >= 1);
    let at = |slot: usize| Step {
        a: xs.as_ptr().wrapping_add(slot),
        a_stride: 4 * slots,
        b: w.as_ptr().wrapping_add(slot * cs),
        b_stride: 2 * cs,
        panel_bytes: 2 * ps,
    };
    let run = |s: Step| {
        // SAFETY: configured for `blocks` blocks by the caller below; operands in bounds by
        // this function's contract.
        unsafe {
            match (blocks, np) {
                (1, 1) => step_one::<1>(s),
                (1, 2) => step_one::<2>(s),
                (1, 3) => step_one::<3>(s),
                (1, _) => step_one::<4>(s),
                (_, 1) => step_two::<1>(s),
                _ => step_two::<2>(s),
            }
        }
    };
    let c_tiles = if blocks == 1 { np } else { 2 + np.min(2) };
    // Not zeroed (4 KiB a call): the stores below write every row read after them.
    let mut stash = std::mem::MaybeUninit::<Sums>::uninit();
    let sums = stash.as_mut_ptr().cast::<f32>();
    let (full, tail) = (slots / STEP, slots % STEP);
    // SAFETY: AMX is available by the caller's contract; every tile instruction runs under
    // the configuration loaded before it, and `tilerelease` ends the tile state.
    unsafe {
        step_config(m, if full > 0 { STEP } else { tail }).load();
        for step in 0..full {
            let s = at(step * STEP);
            prefetch(&s, np);
            run(s);
        }
        if tail > 0 {
            if full > 0 {
                // The last step is narrower: reconfigure (which zeroes the tiles) around it.
                store_sums(sums, c_tiles);
                step_config(m, tail).load();
                load_sums(sums, c_tiles);
            }
            run(at(full * STEP));
        }
        store_sums(sums, c_tiles);
        release();
    }
    for q in 0..m {
        let (b, row) = (q / BLOCK, q % BLOCK);
        for r in 0..np {
            let t = b * most_panels + r;
            // SAFETY: C tile `t < c_tiles` has rows `0 .. min(16, m − 16b)`, all stored above;
            // row `q`, panel `r` of the tile is in `dst` by the caller's contract.
            unsafe {
                let lanes = &*sums.add((t * BLOCK + row) * PANEL).cast::<[f32; PANEL]>();
                dst.put(q, r, np, lanes);
            }
        }
    }
}
