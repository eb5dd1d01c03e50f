//! A Python drafter (`dspark.protocols.DrafterProtocol`: `dspark.TorchDrafter`, or any object
//! with the same members) behind the engine's [`Drafter`] trait.

use candle_core::Tensor;
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use dspark::checkpoint::WeightSource;
use dspark::drafter::{Proposal, ProposeOptions};
use dspark::sampling::Seeds;
use dspark::{Drafter, IdMap, Result, VocabSizes};

use crate::args;
use crate::bridge::{host_tensor, int_attr};
use crate::dlpack::DlTensor;
use crate::errors::{callback_error, err};

/// A Python drafter object and the contract members read from it once.
pub struct PyDraftModel {
    obj: Py<PyAny>,
    from_numpy: Option<Py<PyAny>>,
    block: usize,
    noise: u32,
    vocab: VocabSizes,
    id_map: IdMap,
    own_embed: bool,
    own_head: bool,
    target_layers: Vec<i64>,
    capture: Vec<usize>,
    from_anchor: bool,
    confidence: bool,
    width: usize,
}

fn source(own: bool) -> WeightSource {
    if own {
        WeightSource::Own
    } else {
        WeightSource::SharedTarget
    }
}

impl PyDraftModel {
    /// Read the contract members of `obj`; `target_hidden` is the target's hidden size (the
    /// context width is `len(capture_layer_ids) · target_hidden` unless the drafter says
    /// `target_hidden_size`).
    pub fn new(obj: &Bound<'_, PyAny>, target_hidden: usize) -> PyResult<Self> {
        let py = obj.py();
        let vocab = VocabSizes {
            input: int_attr(obj, "vocab_size")?,
            draft: int_attr(obj, "draft_vocab_size")?,
            target: int_attr(obj, "target_vocab_size")?,
        };
        let map = obj.getattr("draft_id_to_target_id")?;
        let id_map = if map.is_none() {
            IdMap::identity(vocab.target)
        } else {
            let (offsets, _) = args::ids(&host_tensor(&map)?, "draft_id_to_target_id")?;
            IdMap::from_offsets(&offsets, vocab.draft, vocab.target)
        }
        .map_err(err)?;
        let capture: Vec<usize> = obj.getattr("capture_layer_ids")?.extract()?;
        let hidden = match obj.getattr("target_hidden_size") {
            Ok(h) if !h.is_none() => h.extract::<usize>()?,
            _ => target_hidden,
        };
        Ok(Self {
            from_numpy: py
                .import("torch")
                .and_then(|t| t.getattr("from_numpy"))
                .ok()
                .map(Bound::unbind),
            block: int_attr(obj, "block_size")?,
            noise: obj.getattr("noise_token_id")?.extract()?,
            vocab,
            id_map,
            own_embed: obj.getattr("has_own_embed_tokens")?.extract()?,
            own_head: obj.getattr("has_own_lm_head")?.extract()?,
            target_layers: obj.getattr("target_layer_ids")?.extract()?,
            width: capture.len() * hidden,
            capture,
            from_anchor: obj.getattr("sample_from_anchor")?.extract()?,
            confidence: obj.getattr("has_confidence_head")?.extract()?,
            obj: obj.clone().unbind(),
        })
    }

    /// Run `f` with the GIL; a Python exception it raises becomes the engine's
    /// [`Error::Callback`] for `context` (e.g. `drafter.propose_states`).
    fn call<R>(&self, context: &str, f: impl FnOnce(Python<'_>) -> PyResult<R>) -> Result<R> {
        Python::attach(|py| f(py).map_err(|e| callback_error(context, e)))
    }

    /// A torch tensor (numpy when torch is missing) holding `t`'s values; a CUDA `t` (a torch
    /// target's hidden states on its device) goes to torch through DLPack, on the device.
    fn to_py<'py>(&self, py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
        #[cfg(feature = "cuda")]
        if t.device().is_cuda() {
            let t = t
                .to_dtype(candle_core::DType::F32)
                .map_err(|e| err(e.into()))?;
            let arr = Bound::new(py, crate::dlpack::cuda::DeviceArray::new(t)?)?;
            return py.import("torch")?.call_method1("from_dlpack", (arr,));
        }
        let dims = t.dims().to_vec();
        let values = t
            .to_dtype(candle_core::DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| err(e.into()))?;
        let arr = PyArray1::from_vec(py, values).reshape(dims)?.into_any();
        match &self.from_numpy {
            Some(f) => Ok(f.call1(py, (arr,))?.into_bound(py)),
            None => Ok(arr),
        }
    }
}

/// The values of a float tensor a drafter returned, widened to `f32` (the round loop checks
/// their count).
fn floats(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<f32>> {
    let t = DlTensor::from_py(&host_tensor(obj)?, name)?;
    Ok(t.floats()?.to_f32_vec())
}

impl Drafter for PyDraftModel {
    type State = Py<PyAny>;

    fn block_size(&self) -> usize {
        self.block
    }

    fn num_draft_tokens(&self) -> usize {
        self.block
    }

    fn noise_token(&self) -> u32 {
        self.noise
    }

    fn vocab(&self) -> VocabSizes {
        self.vocab
    }

    fn id_map(&self) -> &IdMap {
        &self.id_map
    }

    fn embed_source(&self) -> WeightSource {
        source(self.own_embed)
    }

    fn lm_head_source(&self) -> WeightSource {
        source(self.own_head)
    }

    fn target_layer_ids(&self) -> &[i64] {
        &self.target_layers
    }

    fn capture_layer_ids(&self) -> &[usize] {
        &self.capture
    }

    fn sample_from_anchor(&self) -> bool {
        self.from_anchor
    }

    fn has_confidence_head(&self) -> bool {
        self.confidence
    }

    fn context_width(&self) -> usize {
        self.width
    }

    fn new_state(&self) -> Result<Py<PyAny>> {
        self.call("drafter.new_state", |py| {
            self.obj.call_method0(py, "new_state")
        })
    }

    fn extend(&self, state: &mut Py<PyAny>, features: &Tensor, start: usize) -> Result<()> {
        self.call("drafter.extend", |py| {
            let f = self.to_py(py, features)?;
            state.call_method1(py, "extend", (f, start))?;
            Ok(())
        })
    }

    fn truncate(&self, state: &mut Py<PyAny>, len: usize) -> Result<()> {
        self.call("drafter.truncate", |py| {
            state.call_method1(py, "truncate", (len,))?;
            Ok(())
        })
    }

    fn state_end(&self, state: &Py<PyAny>) -> usize {
        Python::attach(|py| {
            let s = state.bind(py);
            s.getattr("end")
                .or_else(|_| s.getattr("length"))
                .and_then(|v| v.extract::<usize>())
                .unwrap_or(0)
        })
    }

    fn propose_cached(
        &self,
        states: &[&Py<PyAny>],
        anchors: &[u32],
        opts: &ProposeOptions,
    ) -> Result<Proposal> {
        let (b, k, v) = (states.len(), self.block, self.vocab.target);
        self.call("drafter.propose_states", |py| {
            let list = PyList::new(py, states.iter().map(|s| s.bind(py)))?;
            let a: Vec<i64> = anchors.iter().map(|&t| i64::from(t)).collect();
            let mut a = PyArray1::from_vec(py, a).into_any();
            if let Some(f) = &self.from_numpy {
                a = f.call1(py, (a,))?.into_bound(py);
            }
            let kw = PyDict::new(py);
            kw.set_item("temperature", opts.temperature)?;
            match &opts.seeds {
                Seeds::Scalar(s) => kw.set_item("seed", *s)?,
                Seeds::PerRequest(s) => kw.set_item("seed", PyList::new(py, s)?)?,
            }
            let p = self
                .obj
                .bind(py)
                .call_method("propose_states", (list, a), Some(&kw))?;
            // Converted as returned: the round loop checks the block's shape and ids.
            let (ids, _) = args::ids(&host_tensor(&p.getattr("tokens")?)?, "tokens")?;
            let tokens = args::ids_in_vocab(&ids, "tokens", v)?;
            let draft_logits = floats(&p.getattr("draft_logits")?, "draft_logits")?;
            let conf = p.getattr("confidence")?;
            let confidence = if conf.is_none() {
                None
            } else {
                Some(floats(&conf, "confidence")?)
            };
            Ok(Proposal {
                batch: b,
                slots: k,
                target_vocab: v,
                tokens,
                draft_logits,
                confidence,
            })
        })
    }

    fn propose(
        &self,
        context: &Tensor,
        anchors: &[u32],
        start_positions: &[usize],
        opts: &ProposeOptions,
    ) -> Result<Proposal> {
        // Through the cached path: one state per request.
        let b = anchors.len();
        let mut states = Vec::with_capacity(b);
        for i in 0..b {
            let mut s = self.new_state()?;
            let start = match start_positions {
                [one] => *one,
                many => many.get(i).copied().unwrap_or(0),
            };
            self.extend(&mut s, &context.get(i)?, start)?;
            states.push(s);
        }
        let refs: Vec<&Py<PyAny>> = states.iter().collect();
        self.propose_cached(&refs, anchors, opts)
    }
}
