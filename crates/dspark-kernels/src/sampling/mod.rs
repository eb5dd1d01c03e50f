//! Drafting and verification kernels.
//!
//! Each kernel has one home: [`verify`](mod@verify) (lossless rejection sampling), [`markov`] (the
//! sequential Markov block sampler) and [`confidence`](mod@confidence) (the confidence head, with
//! optional [`StsCalibration`]). In each, `mod.rs` holds the options, the validation every path
//! shares and the entry points; `cpu.rs` is the host slice kernel (the reference, SIMD through
//! [`crate::cpu`]); `device.rs` the device-generic path written with candle tensor ops (what a CUDA
//! device runs, and the CPU under `DSPARK_KERNEL_PATH=tensor`).
//!
//! Every kernel has a slice entry that works on borrowed memory ([`Floats`], [`Rows3`],
//! [`Mat`]; the Python glue calls these directly on DLPack/numpy memory) and a thin
//! candle-`Tensor` front. Math is f32 over f32/f16/bf16 inputs, one pass over each row where
//! the math allows, sampling by inverse CDF with a single counter-based uniform ([`rng`]), no
//! full sorts over the vocabulary, and rayon across rows.
//!
//! Shared pieces: `categorical`, `dist` and `filter` (row statistics, target distributions,
//! top-k / top-p), [`mask_padded_rows`] (padded vocabulary columns → `-inf`, a custom op),
//! `ops` and `transfer` (the device path's tensor helpers and host transfers), `args` (the
//! tensor fronts' argument readers), `cuda_ptx` (the PTX kernels of the custom ops), and
//! [`fused`]: the kernels as a few fused CUDA launches each, with their Rust models.
//! The verify-length policies live in `dspark::policy`.

mod args;
mod categorical;
pub mod confidence;
#[cfg(feature = "cuda")]
mod cuda_ptx;
mod dist;
mod filter;
pub mod fused;
pub mod logprobs;
pub mod markov;
mod mask;
mod ops;
pub mod rng;
mod transfer;
pub mod verify;

pub use crate::view::{Floats, Mat, PerRequest, Rows3, Seeds, Tokens};

/// Temperatures below this decode greedily (the argmax), as vLLM's do: a distribution that
/// sharp is the argmax to within float rounding, and sampling it would multiply logits by more
/// than `1e5` (at `1e-38`, past f32's range). Every kernel path, the engine and the Python
/// references use this bound.
pub const GREEDY_BELOW: f32 = 1e-5;

/// Whether temperature `t` decodes greedily ([`GREEDY_BELOW`]).
pub fn is_greedy_temperature(t: f32) -> bool {
    t < GREEDY_BELOW
}
/// The token greedy decoding takes from `row`: the lowest id holding its largest value, as
/// every verify path picks at a greedy temperature (NaN ignored; `0` when no value is finite).
pub fn greedy_token(row: Floats<'_>) -> usize {
    categorical::row_argmax(row).argmax
}

pub use confidence::{StsCalibration, confidence, confidence_slices};
pub use logprobs::{LogprobSampling, MAX_TOP_LOGPROBS, TokenLogprob, token_logprobs};
pub use markov::{
    BlockOptions, DeviceBlock, DraftBlock, MarkovBias, markov_bias, sample_block,
    sample_block_on_device, sample_block_slices, sample_block_slices_fused, sample_block_slices_on,
};
pub use mask::{MaskPadded, mask_padded_rows, mask_padded_slice};
pub use verify::{
    Verification, VerifyOptions, verify, verify_slices, verify_slices_fused, verify_slices_on,
};
