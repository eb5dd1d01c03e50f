//! # dspark-kernels
//!
//! dspark's kernels and model layers on candle tensors: the SIMD helpers ([`cpu`]), the shared
//! layers and packed weight panels ([`nn`]), the drafting and verification samplers
//! ([`sampling`]), device selection ([`device`]), host views of tensors ([`view`]) and the
//! thread-pool policy ([`threads`]). Each kernel runs on the CPU fast path (the reference) and
//! on any candle device; CUDA is behind the `cuda` feature.
//!
//! The contracts these layers read (configs, checkpoints, the error type) are
//! `dspark-contracts`'; the engine that drives them is `dspark`.

// The contracts' modules under their usual paths inside this crate (`crate::error`, ...).
pub(crate) use dspark_contracts::{checkpoint, config, error, idmap, limits};

#[doc(hidden)]
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda_interop;
pub mod device;
pub mod nn;
pub mod open;
pub mod sampling;
#[doc(hidden)]
pub mod test_values;
pub mod threads;
pub mod trace;
pub mod view;

pub use nn::{LoadOptions, WeightDtype};
