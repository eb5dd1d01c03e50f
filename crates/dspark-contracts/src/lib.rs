//! # dspark-contracts
//!
//! Every contract a DSpark drafter has with its target model, with no tensor library: config
//! normalization ([`config`]), checkpoint weight rules ([`checkpoint`]), vocabulary layout
//! ([`vocab`]), the draft-to-target id map ([`idmap`]), the load report
//! ([`inspect`](mod@inspect)), the input limits ([`limits`]) and the one error type ([`error`]).
//!
//! Another engine can depend on this crate alone to load DSpark checkpoints the way dspark does.
//! The `candle` feature adds `Error::Candle` and the conversion from candle's error, for the
//! crates that compute with candle (`dspark-kernels`, `dspark`).

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod files;
pub mod idmap;
pub mod inspect;
pub mod limits;
pub mod vocab;

pub use checkpoint::{Inventory, LoadPlan, TensorInfo, WeightSource};
pub use config::{
    ConfigFormat, DraftSpec, MarkovHeadType, NoiseToken, NoiseTokenSource, StsCalibration,
    TargetSpec,
};
pub use error::{Error, ErrorKind, Result, Warning};
pub use idmap::IdMap;
pub use inspect::{InspectOptions, Report, inspect, inspect_with};
pub use vocab::{VocabLayout, VocabSizes};
