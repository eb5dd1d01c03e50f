//! Parsing one safetensors header without touching tensor data.

use std::path::PathBuf;

use serde::Serialize;

/// One tensor as described by a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorInfo {
    /// Name as stored in the checkpoint.
    pub name: String,
    /// safetensors dtype string (`"BF16"`, `"F32"`, `"I64"`, ...).
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// The file holding the data.
    pub file: PathBuf,
    /// Byte range of the data, relative to the start of the data section.
    pub data_offsets: (u64, u64),
}
