//! GGUF files (llama.cpp's format): the header read by candle's maintained reader
//! ([`candle_core::quantized::gguf_file`]), the tensors' bytes memory-mapped and taken as they
//! are: float tensors decoded as safetensors ones are ([`super::weights`]), quantized matrices
//! regrouped into their block formats ([`PackedWeight::Q8`], [`PackedWeight::Q4K`],
//! [`PackedWeight::Q6K`]), never widened.
//!
//! [`GgufFile::open`] checks every tensor before any is read (its type is one dspark reads, its
//! element count fills whole blocks, its bytes lie within the file), so a truncated file or an
//! unsupported type is one typed error (`bad-gguf`, every problem listed) naming the file and
//! the tensor, with nothing half-loaded.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::ops::Range;
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use candle_core::{Device, Tensor};
use memmap2::Mmap;

use super::packed::PackedWeight;
use super::quant::Quant;
use super::quant::QuantMatrix;
use super::quant::q4k::Q4KMatrix;
use super::quant::q6k::Q6KMatrix;
use super::weights::decode_tensor;
use super::{LoadOptions, WeightDtype};
use crate::error::{Error, Result};

/// The tensor types dspark reads, for messages.
pub const GGUF_TYPES: &str = "F32, F16, BF16, Q8_0, Q4_K, Q6_K";

/// A tensor of a GGUF file as read: a float tensor (on the requested device), or a quantized
/// matrix in its blocks (on the host).
#[derive(Debug)]
pub enum GgufTensor {
    /// F32, F16 or BF16 data.
    Float(Tensor),
    /// A Q8_0, Q4_K or Q6_K matrix.
    Quantized(PackedWeight),
}

/// An opened, checked GGUF file.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    map: Mmap,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("tensors", &self.content.tensor_infos.len())
            .finish()
    }
}

/// A `bad-gguf` error for `path` (and `tensor`, when one is at fault).
pub fn bad_gguf(path: &Path, tensor: Option<&str>, message: impl Into<String>) -> Error {
    Error::BadGguf {
        path: path.to_path_buf(),
        tensor: tensor.map(str::to_string),
        message: message.into(),
    }
}

/// GGUF's name for a tensor type (`Q4_K`, not candle's `Q4K`).
pub fn type_name(t: GgmlDType) -> &'static str {
    match t {
        GgmlDType::F32 => "F32",
        GgmlDType::F16 => "F16",
        GgmlDType::BF16 => "BF16",
        GgmlDType::Q4_0 => "Q4_0",
        GgmlDType::Q4_1 => "Q4_1",
        GgmlDType::Q5_0 => "Q5_0",
        GgmlDType::Q5_1 => "Q5_1",
        GgmlDType::Q8_0 => "Q8_0",
        GgmlDType::Q8_1 => "Q8_1",
        GgmlDType::Q2K => "Q2_K",
        GgmlDType::Q3K => "Q3_K",
        GgmlDType::Q4K => "Q4_K",
        GgmlDType::Q5K => "Q5_K",
        GgmlDType::Q6K => "Q6_K",
        GgmlDType::Q8K => "Q8_K",
    }
}

/// The quantized format of a tensor type dspark reads (`None` for floats and the rest).
fn quant_of(t: GgmlDType) -> Option<Quant> {
    match t {
        GgmlDType::Q8_0 => Some(Quant::Q8_0),
        GgmlDType::Q4K => Some(Quant::Q4K),
        GgmlDType::Q6K => Some(Quant::Q6K),
        _ => None,
    }
}

/// The safetensors name of a float tensor type (`None` for the rest).
fn float_of(t: GgmlDType) -> Option<&'static str> {
    match t {
        GgmlDType::F32 => Some("F32"),
        GgmlDType::F16 => Some("F16"),
        GgmlDType::BF16 => Some("BF16"),
        _ => None,
    }
}

impl GgufFile {
    /// Open and check `path`. Errors: `missing-file`, `io`, and `bad-gguf` for a file that is
    /// not GGUF, a truncated one (naming each tensor whose bytes are missing), or tensors of
    /// a type dspark does not read (naming each; a type id candle does not know is named by
    /// its number, the header being unreadable past it).
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => Error::MissingFile {
                path: path.to_path_buf(),
                what: "a GGUF model file".into(),
            },
            _ => Error::Io {
                path: path.to_path_buf(),
                source,
            },
        })?;
        let content = Content::read(&mut BufReader::new(&file)).map_err(|e| {
            let e = e.to_string();
            let message = match e.strip_prefix("unknown dtype for tensor ") {
                Some(id) => format!(
                    "a tensor has type id {id}, which dspark does not read (it reads \
                     {GGUF_TYPES})"
                ),
                None => format!("not a readable GGUF file: {e}"),
            };
            bad_gguf(path, None, message)
        })?;
        // SAFETY: the file is opened read-only; as with every mmap-based model reader, a
        // concurrent writer truncating it is outside our contract.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let me = Self {
            path: path.to_path_buf(),
            content,
            map,
        };
        let mut names: Vec<&String> = me.content.tensor_infos.keys().collect();
        names.sort();
        let problems = names
            .into_iter()
            .filter_map(|name| me.span(name).err())
            .collect();
        Error::collect(problems)?;
        Ok(me)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.content
            .tensor_infos
            .get(name)
            .ok_or_else(|| Error::MissingTensor {
                tensor: name.to_string(),
                reason: format!("not in {}", self.path.display()),
            })
    }

    /// Where tensor `name`'s bytes lie in the file, checked (see [`Self::open`]).
    fn span(&self, name: &str) -> Result<Range<usize>> {
        let info = self.info(name)?;
        let t = info.ggml_dtype;
        if quant_of(t).is_none() && float_of(t).is_none() {
            return Err(bad_gguf(
                &self.path,
                Some(name),
                format!(
                    "type {} is not one dspark reads ({GGUF_TYPES})",
                    type_name(t)
                ),
            ));
        }
        let elems = info.shape.elem_count();
        if !elems.is_multiple_of(t.block_size()) {
            return Err(bad_gguf(
                &self.path,
                Some(name),
                format!(
                    "{elems} elements do not fill whole {} blocks of {}",
                    type_name(t),
                    t.block_size()
                ),
            ));
        }
        let size = elems / t.block_size() * t.type_size();
        let start = usize::try_from(self.content.tensor_data_offset.saturating_add(info.offset))
            .unwrap_or(usize::MAX);
        match start.checked_add(size).filter(|&end| end <= self.map.len()) {
            Some(end) => Ok(start..end),
            None => Err(bad_gguf(
                &self.path,
                Some(name),
                format!(
                    "its {size} bytes at offset {start} run past the end of the file ({} \
                     bytes): the file is truncated",
                    self.map.len()
                ),
            )),
        }
    }

    /// The metadata value at `key`.
    pub fn value(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    /// Every metadata entry.
    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    fn bad_key(&self, key: &str, what: &str) -> Error {
        bad_gguf(&self.path, None, format!("metadata `{key}` is not {what}"))
    }

    /// The integer at `key` (any integer type); `bad-gguf` when it is something else.
    pub fn uint(&self, key: &str) -> Result<Option<u64>> {
        let Some(v) = self.value(key) else {
            return Ok(None);
        };
        let n = match v {
            Value::U8(x) => Some(u64::from(*x)),
            Value::U16(x) => Some(u64::from(*x)),
            Value::U32(x) => Some(u64::from(*x)),
            Value::U64(x) => Some(*x),
            Value::I8(x) => u64::try_from(*x).ok(),
            Value::I16(x) => u64::try_from(*x).ok(),
            Value::I32(x) => u64::try_from(*x).ok(),
            Value::I64(x) => u64::try_from(*x).ok(),
            _ => None,
        };
        n.map(Some)
            .ok_or_else(|| self.bad_key(key, "a non-negative integer"))
    }

    /// The number at `key` (a float or an integer); `bad-gguf` when it is something else. An
    /// f32 is read as the shortest decimal that rounds to it (the `1e-6` a converter wrote as
    /// an f32, not `9.99999997e-7`).
    pub fn float(&self, key: &str) -> Result<Option<f64>> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(x.to_string().parse().unwrap_or(f64::from(*x)))),
            Some(Value::F64(x)) => Ok(Some(*x)),
            Some(_) => self
                .uint(key)
                .map(|n| n.map(|n| n as f64))
                .map_err(|_| self.bad_key(key, "a number")),
        }
    }

    /// The string at `key`; `bad-gguf` when it is something else.
    pub fn string(&self, key: &str) -> Result<Option<&str>> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.bad_key(key, "a string")),
        }
    }

    /// The array of strings at `key`; `bad-gguf` when it is something else.
    pub fn strings(&self, key: &str) -> Result<Option<Vec<&str>>> {
        match self.value(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.as_str()),
                    _ => Err(self.bad_key(key, "an array of strings")),
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(_) => Err(self.bad_key(key, "an array of strings")),
        }
    }

    /// Every tensor's name, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .content
            .tensor_infos
            .keys()
            .map(String::as_str)
            .collect();
        names.sort_unstable();
        names
    }

    /// Whether the file holds tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Tensor `name`'s shape, outermost first (`[out, in]` for a matrix, as PyTorch's).
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.content.tensor_infos.get(name).map(|i| i.shape.dims())
    }

    /// Tensor `name`'s type, by GGUF's name (`Q4_K`).
    pub fn type_of(&self, name: &str) -> Option<&'static str> {
        self.content
            .tensor_infos
            .get(name)
            .map(|i| type_name(i.ggml_dtype))
    }

    /// Tensor `name`'s quantized format (`None` for a float tensor or a missing one).
    pub fn quant(&self, name: &str) -> Option<Quant> {
        self.content
            .tensor_infos
            .get(name)
            .and_then(|i| quant_of(i.ggml_dtype))
    }

    /// Read tensor `name`: a float one onto `device` (a matrix in the dtype `options` choose
    /// for it, [`LoadOptions::matrix_dtype`], anything else in f32), a quantized matrix as its
    /// blocks, regrouped from the file's bytes. Errors: `missing-tensor`; `bad-gguf` for a
    /// quantized tensor that is not a matrix or whose scales are not finite.
    pub fn read(&self, name: &str, device: &Device, options: &LoadOptions) -> Result<GgufTensor> {
        let info = self.info(name)?;
        let bytes = &self.map[self.span(name)?];
        let shape = info.shape.dims();
        if let Some(stored) = float_of(info.ggml_dtype) {
            let dtype = if shape.len() == 2 {
                options.matrix_dtype(stored)
            } else {
                WeightDtype::F32
            };
            return decode_tensor(name, bytes, stored, shape, dtype, device).map(GgufTensor::Float);
        }
        let &[rows, cols] = shape else {
            return Err(bad_gguf(
                &self.path,
                Some(name),
                format!(
                    "a {} tensor of shape {shape:?}: dspark reads quantized matrices only",
                    type_name(info.ggml_dtype)
                ),
            ));
        };
        let packed = match quant_of(info.ggml_dtype) {
            Some(Quant::Q8_0) => QuantMatrix::from_gguf(bytes, rows, cols).map(PackedWeight::Q8),
            Some(Quant::Q4K) => Q4KMatrix::from_gguf(bytes, rows, cols).map(PackedWeight::Q4K),
            Some(Quant::Q6K) => Q6KMatrix::from_gguf(bytes, rows, cols).map(PackedWeight::Q6K),
            None => None,
        };
        packed.map(GgufTensor::Quantized).ok_or_else(|| {
            bad_gguf(
                &self.path,
                Some(name),
                format!(
                    "a [{rows}, {cols}] {} matrix with a scale that is not finite (or rows \
                     that are not whole blocks)",
                    type_name(info.ggml_dtype)
                ),
            )
        })
    }

    /// Tensor `name` as an f32 tensor on `device` whatever its type (a quantized one
    /// dequantized: exact, the values its blocks hold).
    pub fn read_f32(&self, name: &str, device: &Device) -> Result<Tensor> {
        let options = LoadOptions {
            dtype: Some(WeightDtype::F32),
            ..LoadOptions::default()
        };
        match self.read(name, device, &options)? {
            GgufTensor::Float(t) => Ok(t),
            GgufTensor::Quantized(q) => {
                Ok(Tensor::from_vec(q.unpack(), (q.rows(), q.cols()), device)?)
            }
        }
    }
}

#[cfg(test)]
mod tests;
