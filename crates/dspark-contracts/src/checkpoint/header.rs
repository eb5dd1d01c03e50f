//! Parsing one safetensors header without touching tensor data.
//!
//! A safetensors file is `[u64 little-endian header length N][N bytes of JSON][data]`. The JSON
//! maps tensor names to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to
//! the start of the data section), plus an optional `"__metadata__"` string→string map.
//!
//! [`read_header`] reads the 8-byte prefix and the header from disk and nothing else, so its
//! cost does not depend on the size of the data. [`parse_header`] is the pure validator (the
//! fuzz target calls it). Every malformation is an [`Error::BadSafetensors`] naming the file.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use serde_json::error::Category;
use serde_json::value::RawValue;

use crate::error::{Error, Result};
use crate::limits::{MAX_NAME_BYTES, MAX_TENSORS};

/// Largest header accepted (100 MiB). Real headers are kilobytes to a few megabytes; anything
/// larger is treated as a corrupt length prefix rather than read into memory.
pub const MAX_HEADER_LEN: u64 = 100 * 1024 * 1024;

/// Size of the little-endian length prefix.
pub const PREFIX_LEN: u64 = 8;

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

impl TensorInfo {
    /// Number of elements (product of the shape; 1 for a scalar). `None` on overflow.
    pub fn numel(&self) -> Option<u64> {
        numel(&self.shape)
    }

    /// Length of the tensor's data in bytes.
    pub fn byte_len(&self) -> u64 {
        self.data_offsets.1.saturating_sub(self.data_offsets.0)
    }
}

/// Bits per element of a safetensors dtype, `None` for an unknown dtype string.
pub fn dtype_bits(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" | "F8_E4M3FNUZ"
        | "F8_E5M2FNUZ" => 8,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        _ => return None,
    })
}

fn numel(shape: &[usize]) -> Option<u64> {
    shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))
}

/// `bad-safetensors` naming `path`.
pub(super) fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::BadSafetensors {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// `too-large` when `count` (in `unit`) of `what` in `place` is past `limit`.
pub(super) fn at_most(
    place: &Path,
    what: &str,
    count: u64,
    limit: u64,
    unit: &'static str,
) -> Result<()> {
    if count > limit {
        return Err(Error::too_large(
            format!("{}: {what}", place.display()),
            count,
            limit,
            unit,
        ));
    }
    Ok(())
}

fn open_error(path: &Path, source: std::io::Error) -> Error {
    if source.kind() == std::io::ErrorKind::NotFound {
        Error::MissingFile {
            path: path.to_path_buf(),
            what: "safetensors file".into(),
        }
    } else {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Validate the length prefix of a file of `file_len` bytes; returns the header length `N`.
///
/// Errors: file shorter than the prefix, `N` over [`MAX_HEADER_LEN`] (oversized), or
/// `8 + N` past the end of the file (truncated).
pub fn header_len(prefix: [u8; 8], file_len: u64, path: &Path) -> Result<u64> {
    let n = u64::from_le_bytes(prefix);
    if n > MAX_HEADER_LEN {
        return Err(bad(
            path,
            format!("oversized header: length prefix says {n} bytes, the cap is {MAX_HEADER_LEN}"),
        ));
    }
    if n > file_len.saturating_sub(PREFIX_LEN) {
        return Err(bad(
            path,
            format!(
                "truncated: length prefix says {n} header bytes, the file has only {} after the prefix",
                file_len.saturating_sub(PREFIX_LEN)
            ),
        ));
    }
    Ok(n)
}

/// Read the 8-byte prefix of an open file and validate it; returns `(N, file_len)`.
pub(crate) fn read_prefix(file: &mut File, path: &Path) -> Result<(u64, u64)> {
    let file_len = file.metadata().map_err(|e| open_error(path, e))?.len();
    if file_len < PREFIX_LEN {
        return Err(bad(
            path,
            format!("file is {file_len} bytes, shorter than the 8-byte header length prefix"),
        ));
    }
    let mut prefix = [0u8; 8];
    file.read_exact(&mut prefix).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    Ok((header_len(prefix, file_len, path)?, file_len))
}

/// Read and validate the header of the safetensors file at `path`. Reads `8 + N` bytes.
pub fn read_header(path: &Path) -> Result<Vec<TensorInfo>> {
    let mut file = File::open(path).map_err(|e| open_error(path, e))?;
    let (n, file_len) = read_prefix(&mut file, path)?;
    // `n <= MAX_HEADER_LEN`, so the cast cannot truncate.
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    parse_header(&header, file_len - PREFIX_LEN - n, path)
}

/// Parse a whole safetensors file held in memory (prefix, header and data).
pub fn parse_file_bytes(bytes: &[u8], path: &Path) -> Result<Vec<TensorInfo>> {
    let Some((prefix, rest)) = bytes.split_first_chunk::<8>() else {
        return Err(bad(
            path,
            format!(
                "file is {} bytes, shorter than the 8-byte header length prefix",
                bytes.len()
            ),
        ));
    };
    let n = header_len(*prefix, bytes.len() as u64, path)?;
    // `n <= rest.len()` was checked by `header_len`.
    let (header, data) = rest.split_at(n as usize);
    parse_header(header, data.len() as u64, path)
}

/// Map entries in file order, keeping duplicates (serde_json maps keep only the last one).
/// Values stay raw JSON borrowed from the header text and are parsed one at a time; past
/// [`MAX_TENSORS`] entries the rest is skipped (and counted) instead of stored.
struct Entries<'a> {
    entries: Vec<(String, &'a RawValue)>,
    total: u64,
}

impl<'de> Deserialize<'de> for Entries<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object mapping tensor names to descriptions")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Entries<'de>, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(4096));
                let mut total = 0u64;
                while total < MAX_TENSORS {
                    match map.next_entry::<String, &'de RawValue>()? {
                        Some(entry) => entries.push(entry),
                        None => return Ok(Entries { entries, total }),
                    }
                    total += 1;
                }
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
                    total += 1;
                }
                Ok(Entries { entries, total })
            }
        }
        deserializer.deserialize_map(EntriesVisitor)
    }
}

/// Validate a header (the `N` JSON bytes after the prefix) for a data section of `data_len`
/// bytes. Returns the tensors in header order; `path` names the file in errors. More than
/// [`MAX_TENSORS`] entries, or names longer than [`MAX_NAME_BYTES`] together, is `too-large`.
pub fn parse_header(bytes: &[u8], data_len: u64, path: &Path) -> Result<Vec<TensorInfo>> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| bad(path, format!("header is not valid UTF-8: {e}")))?;
    // Values are untyped JSON and keys are always strings, so a data error can only mean
    // the top level is not an object.
    let Entries { entries, total } =
        serde_json::from_str(text).map_err(|e| match e.classify() {
            Category::Data => bad(path, "header is not a JSON object"),
            _ => bad(path, format!("header is not valid JSON: {e}")),
        })?;
    at_most(
        path,
        "tensors in the header",
        total,
        MAX_TENSORS,
        " tensors",
    )?;
    let names: u64 = entries.iter().map(|(n, _)| n.len() as u64).sum();
    at_most(
        path,
        "tensor names in the header",
        names,
        MAX_NAME_BYTES,
        " bytes",
    )?;
    // The first repeated name (in file order), found by sorting indices rather than by
    // keeping a second copy of every name; reported when the walk below reaches it.
    let mut order: Vec<usize> = (0..entries.len()).collect();
    order.sort_unstable_by(|&a, &b| entries[a].0.cmp(&entries[b].0).then(a.cmp(&b)));
    let first_dup = order
        .windows(2)
        .filter(|w| entries[w[0]].0 == entries[w[1]].0)
        .map(|w| w[1])
        .min();
    drop(order);
    let mut tensors = Vec::with_capacity(entries.len());
    for (i, (name, raw)) in entries.into_iter().enumerate() {
        if first_dup == Some(i) {
            return Err(bad(path, format!("duplicate tensor name `{name}`")));
        }
        let desc: Value = serde_json::from_str(raw.get())
            .map_err(|e| bad(path, format!("tensor `{name}`: invalid JSON: {e}")))?;
        if name == "__metadata__" {
            check_metadata(&desc, path)?;
            continue;
        }
        tensors.push(parse_entry(name, &desc, data_len, path)?);
    }
    check_overlaps(&tensors, path)?;
    Ok(tensors)
}

fn check_metadata(desc: &Value, path: &Path) -> Result<()> {
    let obj = desc
        .as_object()
        .ok_or_else(|| bad(path, "`__metadata__` is not a string-to-string map"))?;
    match obj.iter().find(|(_, v)| !v.is_string()) {
        Some((k, _)) => Err(bad(path, format!("`__metadata__.{k}` is not a string"))),
        None => Ok(()),
    }
}

fn parse_entry(name: String, desc: &Value, data_len: u64, path: &Path) -> Result<TensorInfo> {
    let obj = desc.as_object().ok_or_else(|| {
        bad(
            path,
            format!("tensor `{name}`: description is not an object"),
        )
    })?;
    let dtype = obj.get("dtype").and_then(Value::as_str).ok_or_else(|| {
        bad(
            path,
            format!("tensor `{name}`: `dtype` missing or not a string"),
        )
    })?;
    let bits = dtype_bits(dtype)
        .ok_or_else(|| bad(path, format!("tensor `{name}`: unknown dtype `{dtype}`")))?;
    let shape = obj
        .get("shape")
        .and_then(Value::as_array)
        .and_then(|dims| {
            dims.iter()
                .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                .collect::<Option<Vec<usize>>>()
        })
        .ok_or_else(|| {
            bad(
                path,
                format!("tensor `{name}`: `shape` is not a list of non-negative integers"),
            )
        })?;
    let offsets = obj
        .get("data_offsets")
        .and_then(Value::as_array)
        .and_then(|o| match o.as_slice() {
            [b, e] => Some((b.as_u64()?, e.as_u64()?)),
            _ => None,
        })
        .filter(|(b, e)| b <= e)
        .ok_or_else(|| {
            bad(
                path,
                format!("tensor `{name}`: `data_offsets` is not [begin, end] with begin <= end"),
            )
        })?;
    if offsets.1 > data_len {
        return Err(bad(
            path,
            format!(
                "tensor `{name}`: data_offsets end {} is past the end of the data section ({data_len} bytes)",
                offsets.1
            ),
        ));
    }
    let bit_len = numel(&shape)
        .and_then(|n| n.checked_mul(bits))
        .ok_or_else(|| bad(path, format!("tensor `{name}`: shape {shape:?} overflows")))?;
    let found = offsets.1 - offsets.0;
    if bit_len % 8 != 0 {
        return Err(bad(
            path,
            format!("tensor `{name}`: {dtype} {shape:?} is not a whole number of bytes"),
        ));
    }
    if bit_len / 8 != found {
        return Err(bad(
            path,
            format!(
                "tensor `{name}`: {dtype} {shape:?} needs {} bytes, data_offsets span {found}",
                bit_len / 8
            ),
        ));
    }
    Ok(TensorInfo {
        name,
        dtype: dtype.to_string(),
        shape,
        file: path.to_path_buf(),
        data_offsets: offsets,
    })
}

fn check_overlaps(tensors: &[TensorInfo], path: &Path) -> Result<()> {
    let mut ranges: Vec<(u64, u64, &str)> = tensors
        .iter()
        .filter(|t| t.data_offsets.0 < t.data_offsets.1)
        .map(|t| (t.data_offsets.0, t.data_offsets.1, t.name.as_str()))
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        let ((_, end, a), (begin, _, b)) = (pair[0], pair[1]);
        if begin < end {
            return Err(bad(
                path,
                format!("tensors `{a}` and `{b}` have overlapping data ranges"),
            ));
        }
    }
    Ok(())
}
