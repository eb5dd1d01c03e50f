//! The fused CUDA kernels' source run by the host emulation against their Rust models, one
//! binary: `kernels/fused_block.cu` (`block`) and `kernels/fused_verify.cu` (`verify`), with
//! what they share (`common`: a deterministic RNG, values in each dtype).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

mod block;
mod verify;
