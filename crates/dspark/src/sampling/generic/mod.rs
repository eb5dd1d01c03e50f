//! The device-generic kernel path: the same kernels as the slice cores, written with candle
//! tensor operations that exist on every backend (and custom ops where those are not enough).
//!
//! It runs for tensors off the CPU, and on the CPU when `DSPARK_KERNEL_PATH=tensor`
//! ([`crate::device`]). The fast slice kernels are its oracle: greedy results are identical,
//! sampled ones use the same counter-based uniforms (computed on the host, a few per row, and
//! uploaded), so the same seed gives the same draws up to float summation order.

pub(crate) mod confidence;
pub(crate) mod markov;
pub(crate) mod ops;
pub(crate) mod transfer;
pub(crate) mod verify;
