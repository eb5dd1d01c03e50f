//! Reading a drafter's tensors from safetensors through its [`LoadPlan`].
//!
//! Files are memory-mapped once each; every planned tensor (f32, f16, bf16 or f64 on disk) is
//! widened to an `f32` candle tensor on the requested device. Weights the plan takes from the
//! target ([`WeightSource::SharedTarget`]) come from [`SharedWeights`] and are shape-checked:
//! a plan that shares a weight nobody passed is an error, never a silently random tensor.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;

use crate::checkpoint::{Inventory, LoadPlan, TensorInfo, WeightSource};
use crate::error::{Error, Result};

/// Embedding and output head handed over by the target model, used where the load plan says
/// [`WeightSource::SharedTarget`]. Any float dtype; converted to `f32`.
#[derive(Debug, Clone, Default)]
pub struct SharedWeights {
    /// The target's input embedding `[rows >= V_in, H]`.
    pub embed: Option<Tensor>,
    /// The target's output head `[rows >= V_t, H]`.
    pub lm_head: Option<Tensor>,
}

/// Memory maps of the checkpoint files, opened on first use.
pub(crate) struct TensorReader {
    maps: BTreeMap<PathBuf, (Mmap, usize)>,
    device: Device,
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
    pub(crate) fn new(device: &Device) -> Self {
        Self {
            maps: BTreeMap::new(),
            device: device.clone(),
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

    /// Read one tensor as `f32` on the reader's device.
    pub(crate) fn read(&mut self, info: &TensorInfo) -> Result<Tensor> {
        let device = self.device.clone();
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
        let values: Vec<f32> = match info.dtype.as_str() {
            "F32" => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            "F16" => bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            "BF16" => bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            _ => bytes
                .chunks_exact(8)
                .map(|c| {
                    f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32
                })
                .collect(),
        };
        Ok(Tensor::from_vec(values, info.shape.as_slice(), &device)?)
    }
}

/// Every planned tensor of a checkpoint, by canonical name, as `f32` on `device`.
pub(crate) fn load_planned(
    plan: &LoadPlan,
    inventory: &Inventory,
    device: &Device,
) -> Result<BTreeMap<String, Tensor>> {
    let mut reader = TensorReader::new(device);
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
/// (padded vocabularies) are zero-filled. Returned as `f32` on `device`.
pub(crate) fn shared_weight(
    what: &'static str,
    given: Option<&Tensor>,
    source: WeightSource,
    [min_rows, rows, cols]: [usize; 3],
    device: &Device,
) -> Result<Option<Tensor>> {
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
        found: t.dims().to_vec(),
    };
    let &[n, c] = t.dims() else {
        return Err(bad_shape());
    };
    if c != cols || n < min_rows {
        return Err(bad_shape());
    }
    let t = t.to_device(device)?.to_dtype(DType::F32)?;
    let t = if n >= rows {
        t.narrow(0, 0, rows)?
    } else {
        let pad = Tensor::zeros((rows - n, cols), DType::F32, device)?;
        Tensor::cat(&[&t, &pad], 0)?
    };
    Ok(Some(t.contiguous()?))
}
