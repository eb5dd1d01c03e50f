//! Python objects behind the engine's traits: a torch target ([`PyTarget`], the
//! `dspark.protocols.TargetModel` protocol) and a Python drafter ([`PyDraftModel`], the
//! `DrafterProtocol`), each called once per round with the GIL taken only for the call.
//!
//! A Python exception raised inside a call travels inside the engine's [`Error::Callback`]
//! and is re-raised unchanged when the error reaches Python (`errors::err`), so a target's own
//! typed error reaches the user as it was. Its members and what it returns are read by
//! [`crate::user`] (typed errors naming the member or the method); the engine's round loop
//! checks every target's output shapes.
//!
//! A target whose logits are CUDA tensors (the `cuda` build) is read where they are: its
//! logits and hidden states are borrowed through DLPack on its stream, the rows the round uses
//! are gathered on the device, and only token ids and accepted counts cross to the host.

use candle_core::{Device, Tensor};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyList;

use dspark::models::{ForwardCost, TargetInput, TargetModel, TargetOutput};
use dspark::nn::WeightDtype;
use dspark::{Error, Result, limits};

use crate::args;
use crate::dlpack::DlTensor;
use crate::errors::{callback_error, err, retype};
use crate::user;

/// `obj` as a CPU, C-contiguous tensor the DLPack reader takes (torch: detached, moved to the
/// CPU and made contiguous only when needed, one copy at most; anything else unchanged).
pub fn host_tensor<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let mut obj = obj.clone();
    if obj.hasattr("detach")? {
        obj = obj.call_method0("detach")?;
        let cpu = obj
            .getattr("device")
            .and_then(|d| d.getattr("type"))
            .and_then(|t| t.extract::<String>())
            .is_ok_and(|t| t == "cpu");
        if !cpu {
            obj = obj.call_method0("cpu")?;
        }
        if !obj.call_method0("is_contiguous")?.extract::<bool>()? {
            obj = obj.call_method0("contiguous")?;
        }
    }
    Ok(obj)
}

/// A DLPack view of [`host_tensor`]`(obj)`; a failure of the tensor's own methods is an
/// `InputError` naming `name`.
pub fn host_view(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<DlTensor> {
    let host = host_tensor(obj).map_err(|e| retype(obj.py(), e, name, "could not be read"))?;
    DlTensor::from_py(&host, name)
}

/// Copy `[rows…]` slices of a float DLPack tensor into one `f32` vector: `offsets[i]` is the
/// element offset of output row `i`, `width` values each.
fn gather_f32(t: &DlTensor, offsets: &[usize], width: usize) -> PyResult<Vec<f32>> {
    let values = t.floats()?;
    let mut out = Vec::with_capacity(offsets.len() * width);
    for &o in offsets {
        values.extend_f32(o, width, &mut out).ok_or_else(|| {
            err(Error::bad_shape(
                t.name(),
                "row outside the tensor".to_string(),
            ))
        })?;
    }
    Ok(out)
}

/// The device a Python target declares through a `device` attribute (a `torch.device` or a
/// string); the CPU when it has none or when this build has no CUDA.
fn declared_device(obj: &Bound<'_, PyAny>) -> PyResult<Device> {
    let Ok(dev) = obj.getattr("device") else {
        return Ok(Device::Cpu);
    };
    let name = dev.str()?.to_string();
    if !cfg!(feature = "cuda") || !name.starts_with("cuda") {
        return Ok(Device::Cpu);
    }
    dspark::device::parse_device("device", &name).map_err(err)
}

/// A target's outputs as it returned them: host views, or (the `cuda` build) CUDA tensors
/// borrowed in place.
enum Raw {
    Host {
        logits: DlTensor,
        hidden: DlTensor,
    },
    #[cfg(feature = "cuda")]
    Device(crate::bridge_device::DeviceOutput),
}

impl Raw {
    /// Read what `method` returned (`.logits` and `.hidden_states`, tensors) where it lives
    /// (a CUDA pair stays on its device).
    fn read(out: &Bound<'_, PyAny>, method: &str) -> PyResult<Self> {
        let logits = user::tensor(out, method, "logits")?;
        if user::field(out, method, "hidden_states")?.is_none() {
            return Err(err(Error::invalid(
                method,
                "returned no hidden states (output_hidden_states=True is ignored)",
            )));
        }
        let hidden = user::tensor(out, method, "hidden_states")?;
        #[cfg(feature = "cuda")]
        if let Some(device) =
            crate::dlpack::cuda::cuda_device_of(&logits, &user::field_name(method, "logits"))?
        {
            return crate::bridge_device::DeviceOutput::read(&logits, &hidden, &device)
                .map(Raw::Device);
        }
        Ok(Raw::Host {
            logits: host_view(&logits, &user::field_name(method, "logits"))?,
            hidden: host_view(&hidden, &user::field_name(method, "hidden_states"))?,
        })
    }

    fn logits_shape(&self) -> &[usize] {
        match self {
            Raw::Host { logits, .. } => logits.shape(),
            #[cfg(feature = "cuda")]
            Raw::Device(d) => d.logits_shape(),
        }
    }

    fn hidden_shape(&self) -> &[usize] {
        match self {
            Raw::Host { hidden, .. } => hidden.shape(),
            #[cfg(feature = "cuda")]
            Raw::Device(d) => d.hidden_shape(),
        }
    }

    /// `(logits, hidden states)` as `f32` tensors of their own, on the device the target
    /// returned them on: for logits of the expected `[B, S, >= vocab]` and 3-D hidden states,
    /// logits rows `rows` (flat `[B * S]` indices) as `[B, R / B, vocab]` and the hidden states
    /// as returned; anything else whole, as returned, for the round loop's shape check.
    fn gather(self, b: usize, s: usize, rows: &[usize], vocab: usize) -> PyResult<TargetOutput> {
        let ld = self.logits_shape().to_vec();
        let hd = self.hidden_shape().to_vec();
        let shaped = ld.len() == 3 && ld[0] == b && ld[1] == s && ld[2] >= vocab && hd.len() == 3;
        let per_row = rows.len() / b.max(1);
        match self {
            Raw::Host { logits, hidden } if shaped => {
                let vp = ld[2];
                let offsets: Vec<usize> = rows.iter().map(|&r| r * vp).collect();
                let l = gather_f32(&logits, &offsets, vocab)?;
                let h = hidden.floats()?.to_f32_vec();
                Ok(TargetOutput {
                    logits: host_tensor_of(l, &[b, per_row, vocab])?,
                    hidden_states: host_tensor_of(h, &hd)?,
                })
            }
            Raw::Host { logits, hidden } => Ok(TargetOutput {
                logits: host_tensor_of(logits.floats()?.to_f32_vec(), &ld)?,
                hidden_states: host_tensor_of(hidden.floats()?.to_f32_vec(), &hd)?,
            }),
            #[cfg(feature = "cuda")]
            Raw::Device(d) => d.gather(shaped.then_some(rows), b, vocab).map_err(err),
        }
    }
}

/// A host `f32` tensor of `shape` holding `values`.
fn host_tensor_of(values: Vec<f32>, shape: &[usize]) -> PyResult<Tensor> {
    Tensor::from_vec(values, shape, &Device::Cpu).map_err(|e| err(e.into()))
}

/// How a Python target is named in messages, and its forward method.
const OWNER: &str = "target";
const FORWARD: &str = "target.forward";

/// A Python object implementing `dspark.protocols.TargetModel` (HF targets come wrapped in
/// `dspark.target.HFTarget`).
pub struct PyTarget {
    obj: Py<PyAny>,
    /// `torch.from_numpy`, when torch is importable (ids are handed over as torch tensors).
    from_numpy: Option<Py<PyAny>>,
    vocab: usize,
    layers: usize,
    hidden: usize,
    /// Where the target says it runs (its `device` attribute; the CPU when it has none).
    device: Device,
    /// It has `grow(cache, n)` and `retain(cache, keep)` (continuous batching).
    resizable: bool,
    /// It says its forward costs its tokens, not rows × the widest row (`ragged = True`).
    ragged: bool,
    /// What one forward costs (its `forward_cost` mapping, or the estimate), read once.
    cost: ForwardCost,
}

/// The cache of a [`PyTarget`]: the Python cache object and the row lengths it holds.
pub struct PyTargetCache {
    obj: Py<PyAny>,
    lengths: Vec<usize>,
}

impl PyTarget {
    /// Wrap `obj`, reading its sizes once.
    pub fn new(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = obj.py();
        let from_numpy = py
            .import("torch")
            .and_then(|t| t.getattr("from_numpy"))
            .ok()
            .map(Bound::unbind);
        let vocab = user::uint(obj, OWNER, "vocab_size", 1, limits::MAX_VOCAB)?;
        let layers = user::uint(obj, OWNER, "num_hidden_layers", 1, limits::MAX_LAYERS)?;
        let hidden = user::uint(obj, OWNER, "hidden_size", 1, limits::MAX_HIDDEN)?;
        Ok(Self {
            obj: obj.clone().unbind(),
            from_numpy,
            vocab,
            layers,
            hidden,
            device: declared_device(obj)?,
            resizable: obj.hasattr("grow")? && obj.hasattr("retain")?,
            ragged: match user::optional(obj, "ragged")? {
                Some(v) => args::boolean(&v, "target.ragged")?,
                None => false,
            },
            cost: forward_cost_of(obj, layers, hidden, vocab)?,
        })
    }

    /// Run `f` with the GIL; a Python exception it raises becomes the engine's
    /// [`Error::Callback`] for `context` (e.g. `target.forward`).
    fn call<R>(&self, context: &str, f: impl FnOnce(Python<'_>) -> PyResult<R>) -> Result<R> {
        Python::attach(|py| f(py).map_err(|e| callback_error(context, e)))
    }
}

/// Seconds a layer of a target driven from Python spends issuing its operations (torch's
/// eager dispatch: about ten operations of ~10 µs), whatever its tokens.
const PY_LAYER_SECONDS: f64 = 1e-4;

/// What one forward of a Python target costs (see [`dspark::models::ForwardCost`]): its
/// optional `forward_cost` mapping, with `weight_bytes` and `flops_per_token` (positive
/// numbers), `dtype` (`"float32"`, `"bfloat16"` or `"float16"`, the weights' kept dtype) and
/// optionally `layer_seconds`; without one, the estimate from its layers, hidden size and
/// vocabulary. Either way a layer costs [`PY_LAYER_SECONDS`] unless the mapping says. A
/// malformed mapping is `invalid-argument` naming the field.
fn forward_cost_of(
    obj: &Bound<'_, PyAny>,
    layers: usize,
    hidden: usize,
    vocab: usize,
) -> PyResult<ForwardCost> {
    let Some(m) = user::optional(obj, "forward_cost")? else {
        return Ok(ForwardCost {
            layer_seconds: Some(PY_LAYER_SECONDS),
            ..ForwardCost::estimate(layers, hidden, vocab, WeightDtype::F32)
        });
    };
    let name = |key: &str| format!("target.forward_cost[{key:?}]");
    let field = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        m.get_item(key).map_err(|_| {
            err(Error::invalid(
                name(key),
                "missing: expected a mapping with weight_bytes, flops_per_token and dtype",
            ))
        })
    };
    let number = |key: &str| -> PyResult<f64> { args::float(&field(key)?, &name(key)) };
    let dtype = args::string(&field("dtype")?, &name("dtype"))?;
    let layer_seconds = match m.get_item("layer_seconds") {
        Ok(v) if !v.is_none() => args::float(&v, &name("layer_seconds"))?,
        _ => PY_LAYER_SECONDS,
    };
    let cost = ForwardCost {
        weight_bytes: number("weight_bytes")?,
        flops_per_token: number("flops_per_token")?,
        layers,
        dtype: WeightDtype::parse(&name("dtype"), &dtype).map_err(err)?,
        quant: None,
        layer_seconds: Some(layer_seconds),
    };
    cost.validate().map_err(err)?;
    Ok(cost)
}

impl TargetModel for PyTarget {
    type Cache = PyTargetCache;

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn num_hidden_layers(&self) -> usize {
        self.layers
    }

    fn hidden_size(&self) -> usize {
        self.hidden
    }

    fn device(&self) -> Device {
        self.device.clone()
    }

    fn new_cache(&self, batch: usize) -> Result<PyTargetCache> {
        self.call("target.new_cache", |py| {
            Ok(PyTargetCache {
                obj: self.obj.call_method1(py, "new_cache", (batch,))?,
                lengths: vec![0; batch],
            })
        })
    }

    fn forward(
        &self,
        cache: &mut PyTargetCache,
        input: &TargetInput<'_>,
        capture_layer_ids: &[usize],
    ) -> Result<TargetOutput> {
        let (b, s) = (input.batch(), input.width);
        // The flat rows `[B * S]` of the logits the round reads (padding rows read row 0).
        let rows: Vec<usize> = (0..b)
            .flat_map(|r| {
                input
                    .logits
                    .positions(r, input.num_tokens[r], s)
                    .into_iter()
                    .map(move |p| r * s + p.unwrap_or(0))
            })
            .collect();
        let out = self.call(FORWARD, |py| {
            let ids: Vec<i64> = input.tokens.iter().map(|&t| i64::from(t)).collect();
            let mut ids = PyArray1::from_vec(py, ids).reshape([b, s])?.into_any();
            if let Some(f) = &self.from_numpy {
                ids = f.call1(py, (ids,))?.into_bound(py);
            }
            let num = PyList::new(py, input.num_tokens)?;
            let capture = PyList::new(py, capture_layer_ids)?;
            let out = self
                .obj
                .call_method1(py, "forward", (&cache.obj, ids, num, capture))?
                .into_bound(py);
            let out = user::returned(out, FORWARD, "a TargetOutput (.logits, .hidden_states)")?;
            Raw::read(&out, FORWARD)?.gather(b, s, &rows, self.vocab)
        })?;
        for (len, &n) in cache.lengths.iter_mut().zip(input.num_tokens) {
            *len += n;
        }
        Ok(out)
    }

    fn truncate(&self, cache: &mut PyTargetCache, lengths: &[usize]) -> Result<()> {
        if lengths.len() != cache.lengths.len() {
            return Err(Error::bad_shape(
                "lengths",
                format!("{} values for {} rows", lengths.len(), cache.lengths.len()),
            ));
        }
        if let Some(r) = (0..lengths.len()).find(|&r| lengths[r] > cache.lengths[r]) {
            return Err(Error::invalid(
                "lengths",
                format!(
                    "row {r} holds {} tokens, cannot truncate to {}",
                    cache.lengths[r], lengths[r]
                ),
            ));
        }
        if lengths == cache.lengths.as_slice() {
            return Ok(());
        }
        self.call("target.crop", |py| {
            self.obj
                .call_method1(py, "crop", (&cache.obj, PyList::new(py, lengths)?))?;
            Ok(())
        })?;
        cache.lengths.copy_from_slice(lengths);
        Ok(())
    }

    fn cache_lengths(&self, cache: &PyTargetCache) -> Vec<usize> {
        cache.lengths.clone()
    }

    fn resizable(&self) -> bool {
        self.resizable
    }

    fn grow(&self, cache: &mut PyTargetCache, n: usize) -> Result<()> {
        self.call("target.grow", |py| {
            self.obj.call_method1(py, "grow", (&cache.obj, n))?;
            Ok(())
        })?;
        cache.lengths.extend(std::iter::repeat_n(0, n));
        Ok(())
    }

    fn retain(&self, cache: &mut PyTargetCache, keep: &[bool]) -> Result<()> {
        if keep.len() != cache.lengths.len() {
            return Err(Error::bad_shape(
                "keep",
                format!("{} values for {} rows", keep.len(), cache.lengths.len()),
            ));
        }
        self.call("target.retain", |py| {
            self.obj
                .call_method1(py, "retain", (&cache.obj, PyList::new(py, keep)?))?;
            Ok(())
        })?;
        let mut it = keep.iter();
        cache
            .lengths
            .retain(|_| it.next().copied().unwrap_or(false));
        Ok(())
    }

    fn ragged(&self) -> bool {
        self.ragged
    }

    fn forward_cost(&self) -> Result<Option<ForwardCost>> {
        Ok(Some(self.cost))
    }
}
