//! Small vectorizable f32 primitives (exp, max, sum-exp, dot) and runtime CPU dispatch.
//!
//! The primitives are written with fixed-width lane arrays so the compiler vectorizes them; the
//! [`multiversion!`] macro compiles a hot function twice (baseline and AVX2+FMA) and picks the
//! best at run time, so no `-C target-cpu` flag is needed.

/// Lane count of the manual reductions (two AVX2 registers, one AVX-512 register).
pub(crate) const LANES: usize = 16;

/// Define a function whose body is compiled for the baseline target and, on x86-64, also for
/// AVX2+FMA, choosing at run time. The body is generic over `$m: MulAdd` ([`Fused`] in the
/// AVX2+FMA build, [`Unfused`] otherwise). Arguments must be plain (non-generic) types.
///
/// `multiversion!(@avx512 …)` ([`multiversion512!`]) adds the AVX-512 build; the tiers' calls
/// are [`dispatch!`]'s.
macro_rules! multiversion {
    (@$tier:ident $(#[$meta:meta])* $vis:vis fn $name:ident<$m:ident>($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn inner<$m: $crate::cpu::MulAdd>($($arg: $ty),*) $(-> $ret)? $body
            $crate::cpu::dispatch!($tier inner($($arg: $ty),*) $(-> $ret)?)
        }
    };
    ($($f:tt)*) => {
        $crate::cpu::multiversion!(@avx2 $($f)*);
    };
}
pub(crate) use multiversion;

/// [`multiversion!`] with a third build for CPUs with AVX-512 (F+VL): the same AVX2 code, but
/// compiled with 32 vector registers (no spills of the `exp` constants) and `popcnt`. Same bits:
/// only the register allocation and the encodings change, not the operations.
macro_rules! multiversion512 {
    ($($f:tt)*) => {
        $crate::cpu::multiversion!(@avx512 $($f)*);
    };
}
pub(crate) use multiversion512;

/// The tail of a [`multiversion!`] function (expands to its final expression): `avx512` calls
/// `inner::<Fused>` in an AVX-512 build when the CPU has it, then goes on as `avx2`; `avx2`
/// calls `inner::<Fused>` in an AVX2+FMA build when the CPU has it, else `inner::<Unfused>`.
/// `@tier` is one such build: `inner::<Fused>` compiled with `$features`, returned when
/// `$has()` says the CPU has them.
macro_rules! dispatch {
    (avx512 $($call:tt)*) => {{
        $crate::cpu::dispatch!(@tier "avx2,fma,avx512f,avx512vl,popcnt", has_avx512, $($call)*);
        $crate::cpu::dispatch!(avx2 $($call)*)
    }};
    (avx2 $inner:ident($($arg:ident : $ty:ty),*) $(-> $ret:ty)?) => {{
        $crate::cpu::dispatch!(@tier "avx2,fma", has_avx2, $inner($($arg: $ty),*) $(-> $ret)?);
        $inner::<$crate::cpu::Unfused>($($arg),*)
    }};
    (@tier $features:literal, $has:ident, $inner:ident($($arg:ident : $ty:ty),*) $(-> $ret:ty)?) => {
        #[cfg(target_arch = "x86_64")]
        {
            #[target_feature(enable = $features)]
            fn tier($($arg: $ty),*) $(-> $ret)? {
                $inner::<$crate::cpu::Fused>($($arg),*)
            }
            if $crate::cpu::$has() {
                // SAFETY: `$has` checked that this CPU supports the features `tier` is built for.
                return unsafe { tier($($arg),*) };
            }
        }
    };
}
pub(crate) use dispatch;

/// `a·b + c`, fused or not. The fused form is only used where FMA instructions are enabled
/// (elsewhere `f32::mul_add` would be a slow library call).
pub(crate) trait MulAdd {
    /// `a·b + c`.
    fn mul_add(a: f32, b: f32, c: f32) -> f32;
}

/// Fused multiply-add (one rounding).
pub(crate) struct Fused;

/// Separate multiply and add.
pub(crate) struct Unfused;

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

impl MulAdd for Unfused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// `true` when the CPU supports AVX2 and FMA (cached by the standard library).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// `true` when the CPU also supports AVX-512 F+VL and `popcnt` (see [`multiversion512!`]).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx512() -> bool {
    has_avx2()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("popcnt")
}

#[cfg(target_arch = "x86_64")]
pub mod amx;
pub(crate) mod dots;
mod exp;
pub mod pages;
pub(crate) mod par;
mod reduce;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub(crate) use dots::bias_block;
pub(crate) use exp::{exp, exp_with};
pub(crate) use reduce::{dot, dots_portable, max_and_nans, sum_exp, zip_lanes};
#[cfg(test)]
pub(crate) use reduce::{max_and_nans_portable, sum_exp_portable};
