//! Drafting and verification kernels.
//!
//! Every kernel has a slice core that works on borrowed memory ([`Floats`], [`Rows3`], [`Mat`];
//! the Python glue calls these directly on DLPack/numpy memory) and a thin candle-`Tensor` front.
//! Math is f32 over f32/f16/bf16 inputs, one pass over each row where the math allows,
//! sampling by inverse CDF with a single counter-based uniform ([`rng`]), no full sorts over the
//! vocabulary, and rayon across rows.
//!
//! - [`mask_padded_rows`]: padded vocabulary columns → `-inf`.
//! - [`sample_block_slices`] / [`sample_block`]: the sequential Markov block sampler.
//! - [`verify_slices`] / [`verify`]: lossless rejection sampling.
//! - [`confidence_slices`] / [`confidence`]: the confidence head, with optional
//!   [`StsCalibration`].
//! - [`threshold_lengths`], [`schedule_lengths`], [`schedule_lengths_ahead`],
//!   [`schedule_pipelined`]: verify-length policies.

mod bias;
mod categorical;
mod confidence;
#[cfg(feature = "cuda")]
mod cuda_ptx;
mod dist;
pub(crate) mod fastmath;
mod filter;
pub(crate) mod generic;
mod markov;
mod markov_bias_op;
mod markov_check;
mod mask;
mod par;
mod residual;
pub mod rng;
mod schedule;
mod simd;
mod sts;
mod tensor;
mod verify;
mod view;

pub(crate) use bias::bias_block;
pub use confidence::confidence_slices;
pub use generic::markov::DeviceBlock;
pub use markov::{BlockOptions, DraftBlock, sample_block_slices, sample_block_slices_on};
pub use markov_bias_op::{MarkovBias, markov_bias};
pub use mask::{MaskPadded, mask_padded_rows, mask_padded_slice};
pub use schedule::{
    StepsPerSecond, schedule_lengths, schedule_lengths_ahead, schedule_pipelined, threshold_lengths,
};
pub use sts::StsCalibration;
pub use tensor::{confidence, sample_block, sample_block_on_device, verify};
pub use verify::{Verification, VerifyOptions, verify_slices, verify_slices_on};
pub use view::{Floats, Mat, PerRequest, Rows3, Seeds, Tokens};
