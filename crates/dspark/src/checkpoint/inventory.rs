//! The tensors a checkpoint holds: a single safetensors file or an indexed set of shards.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::header::TensorInfo;
use crate::error::{Error, Result};

/// Every tensor of a checkpoint, by checkpoint name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The directory or file the inventory was read from.
    pub root: PathBuf,
    /// The safetensors files read, in order.
    pub files: Vec<PathBuf>,
    tensors: BTreeMap<String, TensorInfo>,
}

impl Inventory {
    /// Build an inventory from tensor descriptions (tests, synthetic checkpoints).
    pub fn from_tensors(
        root: impl Into<PathBuf>,
        tensors: impl IntoIterator<Item = TensorInfo>,
    ) -> Self {
        let tensors: BTreeMap<_, _> = tensors.into_iter().map(|t| (t.name.clone(), t)).collect();
        let mut files: Vec<PathBuf> = tensors.values().map(|t| t.file.clone()).collect();
        files.sort();
        files.dedup();
        Self {
            root: root.into(),
            files,
            tensors,
        }
    }

    /// Open a checkpoint: a `.safetensors` file, or a directory holding `model.safetensors`
    /// or `model.safetensors.index.json` (+ shards). Reads headers only.
    pub fn open(path: &Path) -> Result<Self> {
        Err(Error::MissingFile {
            path: path.to_path_buf(),
            what: "not implemented yet".into(),
        })
    }

    /// Look a tensor up by checkpoint name.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    /// All tensors, sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorInfo> {
        self.tensors.values()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// `true` when the checkpoint holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
}
