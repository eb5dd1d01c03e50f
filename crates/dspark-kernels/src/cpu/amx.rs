//! Intel AMX (Sapphire Rapids and later), as the tile kernels share it: whether this process
//! may run tiles, a tile configuration, and the tile loads and stores. The bf16 panels'
//! `tdpbf16ps` kernel (`nn/packed/amx.rs`) and the Q8_0 blocks' `tdpbssd` kernel
//! (`nn/quant/amx.rs`) build on it.
//!
//! Linux grants the tile data state per process on request (`arch_prctl`); where it refuses
//! (an old kernel, a seccomp filter) no tile kernel is available and nothing changes.
//! [`AMX_ENV`]` = 0` turns them all off.

use std::arch::asm;
use std::sync::OnceLock;

/// The environment variable that turns the AMX kernels off when `0`.
pub const AMX_ENV: &str = "DSPARK_AMX";

/// Tile units a CPU may have beside AMX-TILE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// `tdpbf16ps`: bf16 pairs into f32 sums.
    Bf16,
    /// `tdpbssd` and kin: 8-bit quads into 32-bit sums.
    Int8,
}

/// Whether this process runs `unit`'s tiles: the CPU has AMX-TILE and the unit, the OS enables
/// the tile state, Linux granted it to the process, and [`AMX_ENV`] is not `0`. Decided once.
pub(crate) fn available(unit: Unit) -> bool {
    static READY: OnceLock<Option<(bool, bool)>> = OnceLock::new();
    let units = READY.get_or_init(|| {
        let off = std::env::var(AMX_ENV).is_ok_and(|v| v.trim() == "0");
        let units = cpu_units()?;
        (!off && request_tile_data()).then_some(units)
    });
    match (units, unit) {
        (Some((bf16, _)), Unit::Bf16) => *bf16,
        (Some((_, int8)), Unit::Int8) => *int8,
        (None, _) => false,
    }
}

/// CPUID's AMX-BF16 and AMX-INT8 bits, where it has AMX-TILE and XCR0 the tile state bits
/// (set by the OS); `None` otherwise.
fn cpu_units() -> Option<(bool, bool)> {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    let (max, osxsave) = (__cpuid(0).eax, __cpuid(1).ecx & (1 << 27) != 0);
    if max < 7 || !osxsave {
        return None;
    }
    let edx = __cpuid_count(7, 0).edx;
    let bit = |b: u32| edx & (1 << b) != 0;
    let (lo, _hi): (u32, u32);
    // SAFETY: XGETBV with ECX = 0 exists where CPUID reports OSXSAVE (checked above).
    unsafe {
        asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") _hi, options(nomem, nostack));
    }
    let tile_state = lo & (0b11 << 17) == 0b11 << 17;
    (bit(24) && tile_state).then_some((bit(22), bit(25)))
}

/// Ask Linux for the tile data state (`ARCH_REQ_XCOMP_PERM`, `XFEATURE_XTILEDATA`); `true`
/// when granted. Without it the first tile instruction would fault.
#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a syscall with integer arguments; it changes only the process's permissions.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// A tile configuration (`ldtilecfg`'s 64 bytes: palette 1, each tile's rows and row bytes).
#[repr(C, align(64))]
pub(crate) struct Config([u8; 64]);

impl Config {
    /// Palette 1, every tile unused.
    pub(crate) fn new() -> Self {
        let mut c = [0u8; 64];
        c[0] = 1;
        Self(c)
    }

    /// Tile `t`: `rows` rows of `bytes` bytes (at most 16 and 64).
    pub(crate) fn set(&mut self, t: usize, rows: usize, bytes: usize) {
        debug_assert!(t < 8 && rows <= 16 && bytes <= 64);
        self.0[16 + 2 * t] = bytes as u8;
        self.0[48 + t] = rows as u8;
    }

    /// Load the configuration (zeroes every tile).
    ///
    /// # Safety
    /// [`available`] for the units the tiles then run.
    #[inline(always)]
    pub(crate) unsafe fn load(&self) {
        // SAFETY: a valid palette-1 configuration; AMX is available by the caller's contract.
        unsafe { asm!("ldtilecfg [{}]", in(reg) self.0.as_ptr(), options(nostack, readonly)) };
    }
}

/// End the tile state (`tilerelease`), after a kernel's last tile instruction.
///
/// # Safety
/// AMX-TILE [`available`].
#[inline(always)]
pub(crate) unsafe fn release() {
    // SAFETY: by the caller's contract.
    unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
}

/// `tileloadd tmm$t, [ptr + stride]`: the configured rows of tile `$t`, row `i` from
/// `ptr + i·stride`.
macro_rules! load {
    ($t:literal, $ptr:expr, $stride:expr) => {
        ::std::arch::asm!(
            concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"),
            p = in(reg) $ptr,
            s = in(reg) $stride,
            options(nostack, readonly, preserves_flags)
        )
    };
}
pub(crate) use load;

/// `tilestored [ptr + stride], tmm$t`: the configured rows of tile `$t`, row `i` to
/// `ptr + i·stride`.
macro_rules! store {
    ($t:literal, $ptr:expr, $stride:expr) => {
        ::std::arch::asm!(
            concat!("tilestored [{p} + {s}*1], tmm", $t),
            p = in(reg) $ptr,
            s = in(reg) $stride,
            options(nostack, preserves_flags)
        )
    };
}
pub(crate) use store;
