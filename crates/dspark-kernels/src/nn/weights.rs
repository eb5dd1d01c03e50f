//! Reading a drafter's tensors from safetensors through its [`LoadPlan`].
//!
//! Files are memory-mapped once each. Every planned tensor (f32, f16, bf16 or f64 on disk)
//! becomes a candle tensor on the requested device: matrices (2-D) in the dtype the
//! [`LoadOptions`] choose (by default the one they are stored in, so a bf16 checkpoint stays
//! 2 bytes a weight, on every device), everything else (norms, biases) in `f32`. Weights
//! the plan takes from the target ([`WeightSource::SharedTarget`]) come from
//! [`SharedWeights`] and are shape-checked: a plan that shares a weight nobody passed is an
//! error, never a silently random tensor.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use memmap2::Mmap;

use super::packed::PanelElem;
use super::vocab::VocabWeight;
use super::{LoadOptions, WeightDtype};
use crate::checkpoint::{Inventory, LoadPlan, TensorInfo, WeightSource};
use crate::error::{Error, Result};

/// Embedding and output head handed over by the target model, used where the load plan says
/// [`WeightSource::SharedTarget`]. f32, bf16 or f16 tensors, or packed rows (a quantized
/// target's): a drafter keeps them as they are (shared, not copied, when the rows match)
/// unless its [`LoadOptions`] choose another dtype.
#[derive(Debug, Clone, Default)]
pub struct SharedWeights {
    /// The target's input embedding `[rows >= V_in, H]`.
    pub embed: Option<VocabWeight>,
    /// The target's output head `[rows >= V_t, H]`.
    pub lm_head: Option<VocabWeight>,
    /// The target's output head as its kernels multiply by it (packed, or quantized: a GGUF
    /// file's blocks), over its `V_t` rows. A drafter that takes `lm_head` from the target and
    /// drafts over those same rows multiplies by this one (the same bytes, no second packed
    /// copy), unless its [`LoadOptions`] ask for another dtype.
    pub head: Option<crate::nn::Linear>,
}

/// Memory maps of the checkpoint files, opened on first use.
pub struct TensorReader {
    maps: BTreeMap<PathBuf, (Mmap, usize)>,
    device: Device,
    options: LoadOptions,
}

fn io(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn bad(path: &Path, message: impl Into<String>) -> Error {
    Error::BadSafetensors {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

impl TensorReader {
    /// A reader that places tensors on `device` as `options` say; it maps no file yet.
    pub fn new(device: &Device, options: LoadOptions) -> Self {
        Self {
            maps: BTreeMap::new(),
            device: device.clone(),
            options,
        }
    }

    /// The mapped file and the offset of its data section.
    fn map(&mut self, path: &Path) -> Result<(&Mmap, usize)> {
        if !self.maps.contains_key(path) {
            let file = File::open(path).map_err(|e| io(path, e))?;
            // SAFETY: the checkpoint is opened read-only; as with every mmap-based safetensors
            // reader, a concurrent writer truncating the file is outside our contract.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| io(path, e))?;
            if map.len() < 8 {
                return Err(bad(path, "file is shorter than its 8-byte header prefix"));
            }
            let mut prefix = [0u8; 8];
            prefix.copy_from_slice(&map[..8]);
            let n = usize::try_from(u64::from_le_bytes(prefix))
                .map_err(|_| bad(path, "header length overflows"))?;
            let start = n
                .checked_add(8)
                .filter(|&s| s <= map.len())
                .ok_or_else(|| bad(path, "header length is past the end of the file"))?;
            self.maps.insert(path.to_path_buf(), (map, start));
        }
        let (map, start) = self
            .maps
            .get(path)
            .ok_or_else(|| bad(path, "memory map vanished"))?;
        Ok((map, *start))
    }

    /// Read one tensor onto the reader's device: a matrix (2-D) in the options' dtype for it
    /// ([`LoadOptions::matrix_dtype`]), anything else in `f32`.
    pub fn read(&mut self, info: &TensorInfo) -> Result<Tensor> {
        let device = self.device.clone();
        let dtype = if info.shape.len() == 2 {
            self.options.matrix_dtype(&info.dtype)
        } else {
            WeightDtype::F32
        };
        let (map, start) = self.map(&info.file)?;
        let (b, e) = info.data_offsets;
        let range = usize::try_from(b)
            .ok()
            .zip(usize::try_from(e).ok())
            .and_then(|(b, e)| Some((start.checked_add(b)?, start.checked_add(e)?)))
            .filter(|&(b, e)| b <= e && e <= map.len())
            .ok_or_else(|| {
                bad(
                    &info.file,
                    format!("tensor `{}`: data range is outside the file", info.name),
                )
            })?;
        let bytes = &map[range.0..range.1];
        let numel = info.shape.iter().product::<usize>();
        let width = match info.dtype.as_str() {
            "F32" => 4,
            "F16" | "BF16" => 2,
            "F64" => 8,
            other => {
                return Err(Error::BadDtype {
                    tensor: info.name.clone(),
                    dtype: other.to_string(),
                    expected: "F32, F16, BF16 or F64".into(),
                });
            }
        };
        if numel.checked_mul(width) != Some(bytes.len()) {
            return Err(bad(
                &info.file,
                format!(
                    "tensor `{}`: {numel} {} elements do not fill {} bytes",
                    info.name,
                    info.dtype,
                    bytes.len()
                ),
            ));
        }
        decode_tensor(&info.name, bytes, &info.dtype, &info.shape, dtype, &device)
    }
}

/// Little-endian data of dtype `stored` (`F32`, `F16`, `BF16`, `F64`; `bytes` holding exactly
/// `shape`'s elements) as a tensor of `shape` in `dtype` on `device`. Errors: `non-finite`
/// naming `name` when narrowing turns a finite value infinite.
pub(crate) fn decode_tensor(
    name: &str,
    bytes: &[u8],
    stored: &str,
    shape: &[usize],
    dtype: WeightDtype,
    device: &Device,
) -> Result<Tensor> {
    let overflow = |(at, v): (usize, f32)| Error::NonFinite {
        name: name.to_string(),
        message: format!(
            "element {at} ({v}) overflows {} when narrowed from {stored}: load this \
             checkpoint in float32 or bfloat16",
            dtype.as_str()
        ),
    };
    let host = match dtype {
        WeightDtype::F32 => Tensor::from_vec(
            decode::<f32>(bytes, stored).map_err(overflow)?,
            shape,
            &Device::Cpu,
        ),
        WeightDtype::BF16 => Tensor::from_vec(
            decode::<half::bf16>(bytes, stored).map_err(overflow)?,
            shape,
            &Device::Cpu,
        ),
        WeightDtype::F16 => Tensor::from_vec(
            decode::<half::f16>(bytes, stored).map_err(overflow)?,
            shape,
            &Device::Cpu,
        ),
    }?;
    Ok(host.to_device(device)?)
}

/// Little-endian safetensors data of dtype `stored` (`F32`, `F16`, `BF16`, `F64`; the caller
/// checked the length) as `T`: exact when `T` holds every stored value, else rounded to
/// nearest even (`F64` through `f32`). A finite value that the narrowing turns infinite (1e5
/// in f16) is `Err((its index, its value))`, the first such index: a weight is never silently
/// lost.
fn decode<T: PanelElem>(bytes: &[u8], stored: &str) -> std::result::Result<Vec<T>, (usize, f32)> {
    // Each value read as `(its f32, whether the stored value was finite)`.
    match stored {
        "F32" => convert(bytes, |c: [u8; 4]| {
            let v = f32::from_le_bytes(c);
            (v, v.is_finite())
        }),
        "F16" => convert(bytes, |c: [u8; 2]| {
            let v = half::f16::from_le_bytes(c).to_f32();
            (v, v.is_finite())
        }),
        "BF16" => convert(bytes, |c: [u8; 2]| {
            let v = PanelElem::to_f32(half::bf16::from_le_bytes(c));
            (v, v.is_finite())
        }),
        _ => convert(bytes, |c: [u8; 8]| {
            let v = f64::from_le_bytes(c);
            (v as f32, v.is_finite())
        }),
    }
}

/// Values converted per chunk on the pool (a checkpoint's tensor is up to a few hundred MB: one
/// thread writing it, its pages faulted in one by one, was a tenth of a quantized load).
const DECODE_CHUNK: usize = 1 << 16;

/// `bytes` as `W`-byte values `read` gives, each narrowed to `T` straight from its f32 (no
/// widened copy of the tensor is ever made), in chunks over the pool.
fn convert<T: PanelElem, const W: usize>(
    bytes: &[u8],
    read: impl Fn([u8; W]) -> (f32, bool) + Sync,
) -> std::result::Result<Vec<T>, (usize, f32)> {
    use rayon::prelude::*;
    let (values, _) = bytes.as_chunks::<W>();
    let mut out = vec![T::default(); values.len()];
    let first_lost = out
        .par_chunks_mut(DECODE_CHUNK)
        .zip(values.par_chunks(DECODE_CHUNK))
        .enumerate()
        .filter_map(|(k, (out, values))| {
            for (i, (o, &c)) in out.iter_mut().zip(values).enumerate() {
                let (v, finite) = read(c);
                *o = T::from_f32(v);
                if finite && !PanelElem::to_f32(*o).is_finite() {
                    return Some((k * DECODE_CHUNK + i, v));
                }
            }
            None
        })
        .min_by_key(|&(i, _)| i);
    match first_lost {
        Some(lost) => Err(lost),
        None => Ok(out),
    }
}

/// Every planned tensor of a checkpoint, by canonical name, on `device` (dtypes as
/// [`TensorReader::read`]).
pub fn load_planned(
    plan: &LoadPlan,
    inventory: &Inventory,
    device: &Device,
    options: LoadOptions,
) -> Result<BTreeMap<String, Tensor>> {
    let mut reader = TensorReader::new(device, options);
    let mut out = BTreeMap::new();
    for (canonical, name) in &plan.tensors {
        if canonical == crate::checkpoint::names::D2T_CANONICAL {
            continue; // already validated into the plan's id map
        }
        let info = inventory.get(name).ok_or_else(|| Error::MissingTensor {
            tensor: name.clone(),
            reason: format!(
                "planned but not in the checkpoint at {}",
                inventory.root.display()
            ),
        })?;
        out.insert(canonical.clone(), reader.read(info)?);
    }
    Ok(out)
}

/// A weight taken from the target: present when the plan shares it, 2-D with `cols` columns
/// and at least `min_rows` rows; rows beyond `rows` are dropped and missing rows up to `rows`
/// (padded vocabularies) are zeros. Packed rows stay packed (shared, never widened) on the
/// host fast path when the options keep the target's dtype; otherwise the weight is a tensor
/// on `device` in the options' dtype, else its own (f32, bf16 or f16; anything else becomes
/// f32): no copy when that is the given tensor's dtype and device and its rows match.
pub fn shared_weight(
    what: &'static str,
    given: Option<&VocabWeight>,
    source: WeightSource,
    [min_rows, rows, cols]: [usize; 3],
    device: &Device,
    options: LoadOptions,
) -> Result<Option<VocabWeight>> {
    if source == WeightSource::Own {
        return Ok(None);
    }
    let t = given.ok_or_else(|| Error::MissingTensor {
        tensor: what.to_string(),
        reason: "the load plan shares it from the target (the drafter checkpoint has none), \
                 but no target weight was passed"
            .into(),
    })?;
    let bad_shape = || Error::ShapeMismatch {
        tensor: format!("{what} (from the target)"),
        expected: vec![rows, cols],
        found: match t.dims() {
            Some((n, c)) => vec![n, c],
            None => match t {
                VocabWeight::Tensor(t) => t.dims().to_vec(),
                VocabWeight::Packed { .. } => Vec::new(),
            },
        },
    };
    let Some((n, c)) = t.dims() else {
        return Err(bad_shape());
    };
    if c != cols || n < min_rows {
        return Err(bad_shape());
    }
    if let VocabWeight::Packed { weight, .. } = t
        && options.dtype.is_none()
        && crate::device::fast_on(device)
    {
        let weight = weight.clone();
        return Ok(Some(VocabWeight::Packed { weight, rows }));
    }
    let dtype = match options.dtype {
        Some(d) => d,
        None => WeightDtype::of_candle(t.dtype()).unwrap_or(WeightDtype::F32),
    };
    Ok(Some(t.dense(rows, device, dtype.candle())?.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of<const W: usize>(values: &[f64], to: impl Fn(f64) -> [u8; W]) -> Vec<u8> {
        values.iter().flat_map(|&v| to(v)).collect()
    }

    #[test]
    fn every_stored_dtype_decodes_exactly_across_chunks() {
        // More than two chunks, with values each stored dtype holds exactly.
        let n = 2 * DECODE_CHUNK + 17;
        let values: Vec<f64> = (0..n).map(|i| ((i % 509) as f64 - 254.0) / 8.0).collect();
        let stored: [(&str, Vec<u8>); 4] = [
            ("F32", bytes_of(&values, |v| (v as f32).to_le_bytes())),
            (
                "F16",
                bytes_of(&values, |v| half::f16::from_f64(v).to_le_bytes()),
            ),
            (
                "BF16",
                bytes_of(&values, |v| half::bf16::from_f64(v).to_le_bytes()),
            ),
            ("F64", bytes_of(&values, f64::to_le_bytes)),
        ];
        for (dtype, bytes) in &stored {
            let want: Vec<f32> = values.iter().map(|&v| v as f32).collect();
            assert_eq!(decode::<f32>(bytes, dtype), Ok(want.clone()), "{dtype}");
            let bf: Vec<half::bf16> = want.iter().map(|&v| half::bf16::from_f32(v)).collect();
            assert_eq!(decode::<half::bf16>(bytes, dtype), Ok(bf), "{dtype}");
            let f: Vec<half::f16> = want.iter().map(|&v| half::f16::from_f32(v)).collect();
            assert_eq!(decode::<half::f16>(bytes, dtype), Ok(f), "{dtype}");
        }
    }

    #[test]
    fn the_first_value_a_narrowing_loses_is_named_whatever_the_chunks() {
        let n = 3 * DECODE_CHUNK;
        let mut values = vec![1.5f64; n];
        // Lost in f16 (and 1e40 in f32 too), in the third chunk, then in the second.
        values[2 * DECODE_CHUNK + 5] = 1e40;
        values[DECODE_CHUNK + 3] = 1e5;
        let f32s = bytes_of(&values[..DECODE_CHUNK + 10], |v| (v as f32).to_le_bytes());
        assert_eq!(
            decode::<half::f16>(&f32s, "F32"),
            Err((DECODE_CHUNK + 3, 1e5))
        );
        assert!(decode::<half::bf16>(&f32s, "F32").is_ok());
        let f64s = bytes_of(&values, f64::to_le_bytes);
        assert_eq!(
            decode::<f32>(&f64s, "F64"),
            Err((2 * DECODE_CHUNK + 5, f32::INFINITY))
        );
        assert_eq!(
            decode::<half::f16>(&f64s, "F64"),
            Err((DECODE_CHUNK + 3, 1e5))
        );
        // Stored infinities and NaN are kept, never an error.
        let inf = bytes_of(&[f64::INFINITY, f64::NAN, -1.0], |v| {
            (v as f32).to_le_bytes()
        });
        let got = decode::<half::f16>(&inf, "F32").unwrap();
        assert!(got[0].is_infinite() && got[1].is_nan() && got[2] == half::f16::from_f32(-1.0));
    }
}
