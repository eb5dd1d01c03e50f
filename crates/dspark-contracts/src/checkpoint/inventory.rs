//! The tensors a checkpoint holds: a single safetensors file or an indexed set of shards.
//!
//! Opening an inventory reads safetensors headers only. The one data read is
//! [`Inventory::read_i64`], for the small `d2t` table.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use super::header::{self, PREFIX_LEN, TensorInfo, at_most, bad};
use crate::error::{Error, Result};
use crate::files::read_bounded;
use crate::limits::{MAX_NAME_BYTES, MAX_TENSORS, MAX_VOCAB};

/// Name of the shard index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Name of a single-file checkpoint inside a directory.
pub const SINGLE_FILE: &str = "model.safetensors";

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

    /// Open a checkpoint: a `.safetensors` file (or a `*.index.json` shard index), or a
    /// directory holding `model.safetensors.index.json` (+ shards), else `model.safetensors`,
    /// else every `*.safetensors` file in it (sorted). Reads headers only, each file once.
    ///
    /// Errors: `missing-file` (no checkpoint, a missing shard), `bad-safetensors` (a malformed
    /// header or index, a tensor in two files, an index entry its shard does not hold), `io`.
    pub fn open(path: &Path) -> Result<Self> {
        let meta = std::fs::metadata(path).map_err(|e| io_error(path, e, "checkpoint"))?;
        if meta.is_file() {
            let is_index = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".index.json"));
            return if is_index {
                let dir = path.parent().unwrap_or(Path::new("."));
                Self::open_index(path, dir, path)
            } else {
                Self::open_files(path, vec![path.to_path_buf()])
            };
        }
        let index = path.join(INDEX_FILE);
        if index.is_file() {
            return Self::open_index(path, path, &index);
        }
        let single = path.join(SINGLE_FILE);
        if single.is_file() {
            return Self::open_files(path, vec![single]);
        }
        let mut files = Vec::new();
        let entries = std::fs::read_dir(path).map_err(|e| io_error(path, e, "checkpoint"))?;
        for entry in entries {
            let entry = entry.map_err(|e| io_error(path, e, "checkpoint"))?;
            let p = entry.path();
            if p.extension().is_some_and(|x| x == "safetensors") && p.is_file() {
                files.push(p);
            }
        }
        if files.is_empty() {
            return Err(Error::MissingFile {
                path: path.to_path_buf(),
                what: format!(
                    "checkpoint weights: no {INDEX_FILE}, {SINGLE_FILE} or *.safetensors"
                ),
            });
        }
        files.sort();
        Self::open_files(path, files)
    }

    /// Read each file's header; a name in two files is an error. More than [`MAX_TENSORS`]
    /// files or tensors, or [`MAX_NAME_BYTES`] of names (all files together), is `too-large`.
    fn open_files(root: &Path, files: Vec<PathBuf>) -> Result<Self> {
        at_most(
            root,
            "safetensors files",
            files.len() as u64,
            MAX_TENSORS,
            " files",
        )?;
        let mut tensors: BTreeMap<String, TensorInfo> = BTreeMap::new();
        let mut problems = Vec::new();
        let (mut seen, mut name_bytes) = (0u64, 0u64);
        for file in &files {
            let infos = match header::read_header(file) {
                Ok(infos) => infos,
                Err(e) => {
                    problems.push(e);
                    continue;
                }
            };
            seen += infos.len() as u64;
            name_bytes += infos.iter().map(|t| t.name.len() as u64).sum::<u64>();
            at_most(
                root,
                "tensor names in the checkpoint",
                name_bytes,
                MAX_NAME_BYTES,
                " bytes",
            )?;
            // All shards together: what the inventory keeps stays bounded.
            at_most(
                root,
                "tensors in the checkpoint",
                seen,
                MAX_TENSORS,
                " tensors",
            )?;
            for info in infos {
                if let Some(prev) = tensors.get(&info.name) {
                    problems.push(bad(
                        file,
                        format!("tensor `{}` is also in {}", info.name, prev.file.display()),
                    ));
                    continue;
                }
                tensors.insert(info.name.clone(), info);
            }
        }
        Error::collect(problems)?;
        Ok(Self {
            root: root.to_path_buf(),
            files,
            tensors,
        })
    }

    /// Read a shard index and the header of every shard it names (once each).
    fn open_index(root: &Path, dir: &Path, index: &Path) -> Result<Self> {
        let weight_map = read_weight_map(index)?;
        let mut shards: Vec<&str> = weight_map.values().map(String::as_str).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut problems = Vec::new();
        let mut files = Vec::new();
        for shard in &shards {
            let file = dir.join(shard);
            if file.is_file() {
                files.push(file);
            } else {
                problems.push(Error::MissingFile {
                    path: file,
                    what: format!("shard listed in {}", index.display()),
                });
            }
        }
        Error::collect(std::mem::take(&mut problems))?;
        let inventory = Self::open_files(root, files)?;
        for (name, shard) in &weight_map {
            let expected = dir.join(shard);
            match inventory.tensors.get(name) {
                Some(info) if info.file == expected => {}
                Some(info) => problems.push(bad(
                    index,
                    format!(
                        "tensor `{name}` is mapped to shard `{shard}` but stored in {}",
                        info.file.display()
                    ),
                )),
                None => problems.push(bad(
                    index,
                    format!("tensor `{name}` is mapped to shard `{shard}`, which does not hold it"),
                )),
            }
        }
        for name in inventory.tensors.keys() {
            if !weight_map.contains_key(name) {
                problems.push(bad(
                    index,
                    format!("tensor `{name}` is stored in a shard but not listed in `weight_map`"),
                ));
            }
        }
        Error::collect(problems)?;
        Ok(inventory)
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

    /// Read an integer tensor (`I64` or `I32`, little-endian) as `i64`s: the one tensor-data
    /// read of checkpoint validation, used for `d2t`. Reads only that tensor's bytes.
    ///
    /// The header's element count is checked before anything is read: above
    /// [`MAX_VOCAB`] it is `too-large`. Errors: `missing-tensor`, `bad-dtype` (any other
    /// dtype), `too-large`, `bad-safetensors` (the data range is past the end of the file, or
    /// the file changed since its header was read), `io`.
    pub fn read_i64(&self, name: &str) -> Result<Vec<i64>> {
        let info = self.get(name).ok_or_else(|| Error::MissingTensor {
            tensor: name.to_string(),
            reason: format!("not in the checkpoint at {}", self.root.display()),
        })?;
        let width = match info.dtype.as_str() {
            "I64" => 8,
            "I32" => 4,
            other => {
                return Err(Error::BadDtype {
                    tensor: name.to_string(),
                    dtype: other.to_string(),
                    expected: "I64 or I32".into(),
                });
            }
        };
        let path = &info.file;
        let (begin, end) = info.data_offsets;
        let len = end - begin.min(end);
        let numel = info.numel().unwrap_or(u64::MAX);
        // Sized from the header only: refuse before anything is read or allocated.
        if numel > MAX_VOCAB {
            return Err(Error::too_large(
                format!("tensor `{name}`"),
                numel,
                MAX_VOCAB,
                " elements",
            ));
        }
        if numel.checked_mul(width) != Some(len) {
            return Err(bad(
                path,
                format!("tensor `{name}`: {numel} elements do not fill {len} bytes"),
            ));
        }
        let mut file = File::open(path).map_err(|e| io_error(path, e, "safetensors file"))?;
        let (n, file_len) = header::read_prefix(&mut file, path)?;
        let start = PREFIX_LEN.checked_add(n).and_then(|x| x.checked_add(begin));
        let Some(start) =
            start.filter(|&s| s.checked_add(len).is_some_and(|stop| stop <= file_len))
        else {
            return Err(bad(
                path,
                format!("tensor `{name}`: data range is past the end of the file"),
            ));
        };
        file.seek(SeekFrom::Start(start))
            .map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
        // `numel <= MAX_VOCAB`, so these fit; decoded in chunks (no second full-size buffer).
        let count = usize::try_from(numel).map_err(|_| bad(path, "tensor too large"))?;
        let width = width as usize;
        let mut out = Vec::with_capacity(count);
        let mut chunk = vec![0u8; width * 8192];
        let mut reader = file.take(len);
        while out.len() < count {
            let want = (count - out.len()).min(8192) * width;
            reader
                .read_exact(&mut chunk[..want])
                .map_err(|source| Error::Io {
                    path: path.clone(),
                    source,
                })?;
            let bytes = &chunk[..want];
            if width == 8 {
                out.extend(bytes.chunks_exact(8).map(|c| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(c);
                    i64::from_le_bytes(b)
                }));
            } else {
                out.extend(bytes.chunks_exact(4).map(|c| {
                    let mut b = [0u8; 4];
                    b.copy_from_slice(c);
                    i64::from(i32::from_le_bytes(b))
                }));
            }
        }
        Ok(out)
    }
}

fn io_error(path: &Path, source: std::io::Error, what: &str) -> Error {
    if source.kind() == std::io::ErrorKind::NotFound {
        Error::MissingFile {
            path: path.to_path_buf(),
            what: what.to_string(),
        }
    } else {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Read `weight_map` (tensor name → shard file name) from a shard index.
fn read_weight_map(index: &Path) -> Result<BTreeMap<String, String>> {
    let limit = crate::limits::MAX_INDEX_BYTES;
    let bytes = read_bounded(index, limit).map_err(|e| {
        e.into_error(index, "shard index", limit, |why| {
            bad(index, format!("shard index: {why}"))
        })
    })?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| bad(index, format!("shard index is not valid JSON: {e}")))?;
    let map = value
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| bad(index, "shard index has no `weight_map` object"))?;
    at_most(
        index,
        "`weight_map` entries",
        map.len() as u64,
        MAX_TENSORS,
        " tensors",
    )?;
    map.iter()
        .map(|(name, shard)| match shard.as_str() {
            Some(s)
                if !s.is_empty()
                    && Path::new(s)
                        .components()
                        .all(|c| matches!(c, Component::Normal(_))) =>
            {
                Ok((name.clone(), s.to_string()))
            }
            _ => Err(bad(
                index,
                format!("`weight_map.{name}` is not a relative shard file name"),
            )),
        })
        .collect()
}
