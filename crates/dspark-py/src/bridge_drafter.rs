//! A Python drafter (`dspark.protocols.DrafterProtocol`: `dspark.TorchDrafter`, or any object
//! with the same members) behind the engine's [`Drafter`] trait.

use candle_core::Tensor;
use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use dspark::checkpoint::WeightSource;
use dspark::drafter::{Proposal, ProposeOptions};
use dspark::sampling::Seeds;
use dspark::{Drafter, DrafterInfo, Error, IdMap, Result, VocabSizes, limits};

use crate::args;
use crate::bridge::{host_tensor, host_view};
use crate::errors::{callback_error, err, retype};
use crate::user;

/// A Python drafter object and the contract members read from it once.
pub struct PyDraftModel {
    obj: Py<PyAny>,
    from_numpy: Option<Py<PyAny>>,
    info: DrafterInfo,
    id_map: IdMap,
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
            input: user::uint(obj, OWNER, "vocab_size", 1, limits::MAX_VOCAB)?,
            draft: user::uint(obj, OWNER, "draft_vocab_size", 1, limits::MAX_VOCAB)?,
            target: user::uint(obj, OWNER, "target_vocab_size", 1, limits::MAX_VOCAB)?,
        };
        let id_map = match user::optional(obj, "draft_id_to_target_id")? {
            None => IdMap::identity(vocab.target),
            Some(map) => {
                let name = "drafter.draft_id_to_target_id";
                let (offsets, _) = args::ids(&host_tensor_of(&map, name)?, name)?;
                IdMap::from_offsets(&offsets, vocab.draft, vocab.target)
            }
        }
        .map_err(err)?;
        let layers = limits::MAX_LAYERS;
        let capture = user::ints(obj, OWNER, "capture_layer_ids", 0, layers - 1, layers)?;
        let capture: Vec<usize> = capture.into_iter().map(|c| c as usize).collect();
        let hidden = user::opt_uint(obj, OWNER, "target_hidden_size", limits::MAX_HIDDEN)?
            .unwrap_or(target_hidden);
        let noise = user::uint(obj, OWNER, "noise_token_id", 0, limits::MAX_VOCAB - 1)?;
        if noise >= vocab.input {
            return Err(err(Error::TokenOutOfRange {
                name: "drafter.noise_token_id".into(),
                id: noise as i64,
                vocab_size: vocab.input,
            }));
        }
        let block = user::uint(obj, OWNER, "block_size", 1, limits::MAX_BLOCK)?;
        let info = DrafterInfo {
            block_size: block,
            num_draft_tokens: block,
            noise_token: noise as u32,
            vocab,
            embed_source: source(user::flag(obj, OWNER, "has_own_embed_tokens")?),
            lm_head_source: source(user::flag(obj, OWNER, "has_own_lm_head")?),
            target_layer_ids: user::ints(obj, OWNER, "target_layer_ids", -1, layers - 1, layers)?,
            context_width: capture.len() * hidden,
            capture_layer_ids: capture,
            sample_from_anchor: user::flag(obj, OWNER, "sample_from_anchor")?,
            has_confidence_head: user::flag(obj, OWNER, "has_confidence_head")?,
        };
        Ok(Self {
            from_numpy: py
                .import("torch")
                .and_then(|t| t.getattr("from_numpy"))
                .ok()
                .map(Bound::unbind),
            info,
            id_map,
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

/// How a Python drafter is named in messages, and its proposing method.
const OWNER: &str = "drafter";
const PROPOSE: &str = "drafter.propose_states";

/// [`host_tensor`] with a failure of the object's own methods typed, naming `name`.
fn host_tensor_of<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    host_tensor(obj).map_err(|e| retype(obj.py(), e, name, "could not be read"))
}

/// The values of float tensor field `field` of a proposal, widened to `f32` (the round loop
/// checks their count).
fn floats(proposal: &Bound<'_, PyAny>, field: &str, shape: &[usize]) -> PyResult<Vec<f32>> {
    let name = user::field_name(PROPOSE, field);
    let t = host_view(&user::tensor(proposal, PROPOSE, field)?, &name)?;
    user::expect_shape(&name, t.shape(), shape)?;
    Ok(t.floats()?.to_f32_vec())
}

/// Confidences must be probabilities: NaN or infinite is `non-finite`, outside `[0, 1]`
/// `invalid-argument` (naming the field).
fn check_confidence(values: &[f32]) -> PyResult<()> {
    let name = user::field_name(PROPOSE, "confidence");
    if let Some(c) = values.iter().find(|c| !c.is_finite()) {
        return Err(err(Error::NonFinite {
            name,
            message: format!("{c}"),
        }));
    }
    if let Some(c) = values.iter().find(|c| !(0.0..=1.0).contains(*c)) {
        return Err(err(Error::invalid(name, format!("{c} is not in [0, 1]"))));
    }
    Ok(())
}

impl Drafter for PyDraftModel {
    type State = Py<PyAny>;

    fn info(&self) -> &DrafterInfo {
        &self.info
    }

    fn id_map(&self) -> &IdMap {
        &self.id_map
    }

    fn new_state(&self) -> Result<Py<PyAny>> {
        const NEW_STATE: &str = "drafter.new_state";
        self.call(NEW_STATE, |py| {
            let state = self.obj.bind(py).call_method0("new_state")?;
            let state = user::returned(state, NEW_STATE, "a draft state (.extend, .truncate)")?;
            for method in ["extend", "truncate"] {
                if !state.getattr(method).is_ok_and(|m| m.is_callable()) {
                    return Err(err(Error::invalid(
                        NEW_STATE,
                        format!(
                            "returned a {} without a `.{method}` method",
                            args::type_name(&state)
                        ),
                    )));
                }
            }
            Ok(state.unbind())
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
        let (b, k, v) = (states.len(), self.info.block_size, self.info.vocab.target);
        self.call(PROPOSE, |py| {
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
            let p = user::returned(p, PROPOSE, "a DraftProposal")?;
            // Every field read with its contract shape: tokens [B, K] in the target vocabulary,
            // draft logits [B, K, V_t], confidences [B, K] exactly when the drafter says it
            // has the head (a missing one would silently turn a threshold into full
            // verification).
            let name = user::field_name(PROPOSE, "tokens");
            let (ids, shape) = args::ids(
                &host_tensor_of(&user::tensor(&p, PROPOSE, "tokens")?, &name)?,
                &name,
            )?;
            user::expect_shape(&name, &shape, &[b, k])?;
            let tokens = args::ids_in_vocab(&ids, &name, v)?;
            let draft_logits = floats(&p, "draft_logits", &[b, k, v])?;
            let confidence = if self.info.has_confidence_head {
                let c = floats(&p, "confidence", &[b, k])?;
                check_confidence(&c)?;
                Some(c)
            } else {
                None
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
}
