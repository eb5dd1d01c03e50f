//! # dspark
//!
//! The engine of dspark, a DSpark speculative-decoding core: the drafter ([`drafter`]), the
//! native targets ([`models`]), the serving engine ([`engine`]), the verify-length policies
//! ([`policy`]) and the speculative loop ([`speculator`]).
//!
//! It stands on two crates, re-exported here under the paths users name:
//! - `dspark-contracts`, with no tensor library: config normalization ([`config`]), checkpoint
//!   weight rules ([`checkpoint`]), vocabulary layout ([`vocab`]), the draft-to-target id map
//!   ([`idmap`]), [`inspect`](mod@inspect), [`limits`] and the one [`error`] type;
//! - `dspark-kernels`, on candle tensors: the shared layers ([`nn`]), the drafting and
//!   verification kernels ([`sampling`]), [`device`] selection, host [`view`]s, the [`threads`]
//!   policy and [`trace`].
//!
//! This crate has no Python dependency; the `dspark-py` crate is thin glue over it.

pub use dspark_contracts::{checkpoint, config, error, files, idmap, inspect, limits, vocab};
pub(crate) use dspark_kernels::cpu;
#[cfg(test)]
pub(crate) use dspark_kernels::test_values;
pub use dspark_kernels::{nn, sampling, threads, trace, view};

pub mod device {
    //! Where kernels run and how a device is opened: the kernel path switch and what this build
    //! knows about devices (`dspark_kernels::device`), and device names parsed and CUDA devices
    //! opened with their probes (`dspark_kernels::open`).
    pub use dspark_kernels::device::*;
    pub use dspark_kernels::open::{open_cuda, parse_device};
}

#[cfg(feature = "cuda")]
pub mod cuda_interop {
    //! Sharing CUDA memory with other frameworks (torch through DLPack) without copies
    //! (`dspark_kernels::cuda_interop`), and the process-wide device per ordinal those
    //! exchanges use (`cuda_device`).
    pub use dspark_kernels::cuda_interop::*;
    pub use dspark_kernels::open::cuda_device;
}

pub mod drafter;
pub mod engine;
pub mod models;
pub mod policy;
pub mod speculator;
pub mod sync;

pub use checkpoint::{Inventory, LoadPlan, TensorInfo, WeightSource};
pub use config::{
    ConfigFormat, DraftSpec, MarkovHeadType, NoiseToken, NoiseTokenSource, TargetSpec,
};
pub use drafter::{
    BlockGuide, DraftState, Drafter, DrafterInfo, Guide, InBlockPenalty, Proposal, ProposeOptions,
    Qwen3Drafter, SharedWeights,
};
pub use error::{Error, ErrorKind, Result, Warning};
pub use idmap::IdMap;
pub use inspect::{InspectOptions, Report};
pub use models::Qwen3Target;
pub use models::gguf_files::inspect_with;
pub use nn::{LoadOptions, WeightDtype};
pub use speculator::{Speculator, TargetModel};
pub use vocab::{VocabLayout, VocabSizes};
