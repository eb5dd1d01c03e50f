//! A torch target's CUDA outputs, read in place (the `cuda` build): the logits and hidden
//! states are borrowed through DLPack on our stream (ordered after the forward that wrote
//! them), the rows a round reads are gathered into tensors of our own on the same device, and
//! torch's stream is then made to wait for those copies, so torch can free or reuse the memory
//! as soon as it drops its tensors. Nothing crosses to the host.

use candle_core::{DType, Device, Tensor};
use pyo3::prelude::*;

use dspark::Result;
use dspark::cuda_interop::signal_stream;
use dspark::speculator::TargetOutput;

use crate::dlpack::cuda::{DeviceTensor, import};

/// The borrowed outputs of one forward.
pub struct DeviceOutput {
    logits: DeviceTensor,
    /// `None` for a `[B, S, 0]` capture (nothing to borrow).
    hidden: Option<DeviceTensor>,
    hidden_shape: Vec<usize>,
    device: Device,
    /// torch's current stream on the device (`None` if it could not be read: then we wait).
    torch_stream: Option<usize>,
}

/// `t` detached and C-contiguous (torch: a device-side copy only when it is strided).
fn contiguous<'py>(t: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let mut t = t.clone();
    if t.hasattr("detach")? {
        t = t.call_method0("detach")?;
        if !t.call_method0("is_contiguous")?.extract::<bool>()? {
            t = t.call_method0("contiguous")?;
        }
    }
    Ok(t)
}

fn shape_of(t: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    t.getattr("shape")?.extract::<Vec<usize>>()
}

/// torch's current CUDA stream for the device of tensor `t`, as a raw handle.
fn torch_stream(py: Python<'_>, t: &Bound<'_, PyAny>) -> Option<usize> {
    let dev = t.getattr("device").ok()?;
    py.import("torch")
        .and_then(|m| m.getattr("cuda"))
        .and_then(|c| c.call_method1("current_stream", (dev,)))
        .and_then(|s| s.getattr("cuda_stream"))
        .and_then(|h| h.extract::<usize>())
        .ok()
}

impl DeviceOutput {
    /// Borrow `logits` and `hidden` (both on `device`; another device is `device-mismatch`).
    pub fn read(
        logits: &Bound<'_, PyAny>,
        hidden: &Bound<'_, PyAny>,
        device: &Device,
    ) -> PyResult<Self> {
        let logits = contiguous(logits)?;
        let hidden = contiguous(hidden)?;
        let hidden_shape = shape_of(&hidden)?;
        let empty = hidden_shape.contains(&0);
        Ok(Self {
            torch_stream: torch_stream(logits.py(), &logits),
            logits: import(&logits, "logits", device)?,
            hidden: if empty {
                None
            } else {
                Some(import(&hidden, "hidden_states", device)?)
            },
            hidden_shape,
            device: device.clone(),
        })
    }

    /// The logits' shape.
    pub fn logits_shape(&self) -> &[usize] {
        self.logits.tensor().dims()
    }

    /// The hidden states' shape.
    pub fn hidden_shape(&self) -> &[usize] {
        &self.hidden_shape
    }

    /// The round's outputs as `f32` tensors of our own on the device: with `rows` (flat
    /// `[B * S]` indices; the shapes were found as expected) the logits rows as `[B, R / B,
    /// vocab]` and the hidden states as returned; without, both whole, as returned, for the
    /// round loop's shape check.
    pub fn gather(self, rows: Option<&[usize]>, b: usize, vocab: usize) -> Result<TargetOutput> {
        let l = self.logits.tensor();
        let logits = match rows {
            Some(rows) => {
                let (d, vp) = (l.dims(), l.dims()[2]);
                let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
                let idx = Tensor::from_vec(idx, rows.len(), &self.device)?;
                // `index_select` writes a tensor of our own; the later steps copy only when
                // needed.
                let mut picked = l.reshape((d[0] * d[1], vp))?.index_select(&idx, 0)?;
                if vp != vocab {
                    picked = picked.narrow(1, 0, vocab)?.contiguous()?;
                }
                picked
                    .to_dtype(DType::F32)?
                    .reshape((b, rows.len() / b.max(1), vocab))?
            }
            None => l.to_dtype(DType::F32)?.copy()?,
        };
        let shape = self.hidden_shape.as_slice();
        let hidden = match &self.hidden {
            Some(h) if h.tensor().dtype() == DType::F32 => h.tensor().copy()?,
            Some(h) => h.tensor().to_dtype(DType::F32)?,
            None => Tensor::zeros(shape, DType::F32, &self.device)?,
        };
        // The copies above are queued on our stream: torch's stream waits for them before it
        // can reuse the memory of the tensors we borrowed (dropped with `self`).
        match self.torch_stream {
            Some(s) => signal_stream(&self.device, s)?,
            None => self.device.synchronize()?,
        }
        Ok(TargetOutput {
            logits,
            hidden_states: hidden,
        })
    }
}
