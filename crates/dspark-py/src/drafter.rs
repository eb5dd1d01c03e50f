//! Thin bindings of the candle drafter (`dspark::drafter`): `Drafter` and `DraftState`.
//!
//! Tensors arrive through DLPack (CPU, C-contiguous, float32/float16/bfloat16 features; integer
//! ids) and are copied once into `f32` candle tensors; the GIL is released around all Rust work.
//! Results are fresh numpy arrays; `python/dspark/drafter.py` wraps them (torch when available)
//! and does the HF-model unpacking.

use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use numpy::{PyArray1, PyArray2, PyArray3, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use dspark::checkpoint::{Inventory, LoadPlan};
use dspark::sampling::Seeds;
use dspark::{
    DraftSpec, DraftState, Drafter, Error, Proposal, ProposeOptions, Qwen3Drafter, SharedWeights,
    TargetSpec, WeightSource,
};

use crate::dlpack::DlTensor;
use crate::errors::PyDSparkError;

fn err(e: Error) -> PyErr {
    PyDSparkError(e).into()
}

/// Copy a float DLPack tensor into an `f32` candle tensor on the CPU.
fn tensor_f32(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Tensor> {
    let t = DlTensor::from_py(obj, name)?;
    let shape = t.shape().to_vec();
    let values: Vec<f32> = if let Some(s) = t.slice::<f32>() {
        s.to_vec()
    } else if let Some(s) = t.slice::<half::f16>() {
        s.iter().map(|x| x.to_f32()).collect()
    } else if let Some(s) = t.slice::<half::bf16>() {
        s.iter().map(|x| x.to_f32()).collect()
    } else {
        return Err(err(Error::UnsupportedDtype {
            name: name.to_string(),
            message: format!(
                "{} is not supported (expected float32, float16 or bfloat16)",
                t.dtype().name()
            ),
        }));
    };
    Tensor::from_vec(values, shape, &Device::Cpu).map_err(|e| err(e.into()))
}

/// Token ids (a DLPack tensor or a Python sequence of ints) as `u32`.
fn ids_u32(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u32>> {
    let wide: Vec<i64> = if obj.hasattr("__dlpack__")? {
        let t = DlTensor::from_py(obj, name)?;
        if t.shape().len() > 1 {
            return Err(err(Error::bad_shape(
                name,
                format!("expected one id per request, got shape {:?}", t.shape()),
            )));
        }
        if let Some(s) = t.slice::<i64>() {
            s.to_vec()
        } else if let Some(s) = t.slice::<i32>() {
            s.iter().map(|&x| i64::from(x)).collect()
        } else if let Some(s) = t.slice::<u32>() {
            s.iter().map(|&x| i64::from(x)).collect()
        } else {
            return Err(err(Error::UnsupportedDtype {
                name: name.to_string(),
                message: format!("{} (expected int32, int64 or uint32)", t.dtype().name()),
            }));
        }
    } else {
        obj.extract::<Vec<i64>>().map_err(|_| {
            err(Error::invalid(
                name,
                "expected a 1-D int tensor or list of ints",
            ))
        })?
    };
    wide.into_iter()
        .map(|x| {
            u32::try_from(x).map_err(|_| {
                err(Error::TokenOutOfRange {
                    name: name.to_string(),
                    id: x,
                    vocab_size: u32::MAX as usize,
                })
            })
        })
        .collect()
}

/// An int or a list/tuple of ints.
fn one_or_many(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u64>> {
    if obj.cast::<PyList>().is_ok() || obj.cast::<PyTuple>().is_ok() {
        obj.extract::<Vec<u64>>()
    } else {
        obj.extract::<u64>().map(|x| vec![x])
    }
    .map_err(|_| {
        err(Error::invalid(
            name,
            "expected a non-negative int or one per request",
        ))
    })
}

fn options(
    temperature: f32,
    seed: &Bound<'_, PyAny>,
    top_k: Option<usize>,
) -> PyResult<ProposeOptions> {
    let seeds = if seed.is_none() {
        Seeds::Scalar(0)
    } else if seed.cast::<PyList>().is_ok() || seed.cast::<PyTuple>().is_ok() {
        Seeds::PerRequest(one_or_many(seed, "seed")?)
    } else {
        Seeds::Scalar(one_or_many(seed, "seed")?[0])
    };
    Ok(ProposeOptions {
        temperature,
        seeds,
        top_k,
    })
}

/// `(tokens [B,K] int64, draft_logits [B,K,V_t] float32, confidence [B,K] float32 | None)`.
type ProposalArrays<'py> = (
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray3<f32>>,
    Option<Bound<'py, PyArray2<f32>>>,
);

fn arrays(py: Python<'_>, p: Proposal) -> PyResult<ProposalArrays<'_>> {
    let (b, k, v) = (p.batch, p.slots, p.target_vocab);
    let tokens: Vec<i64> = p.tokens.iter().map(|&t| i64::from(t)).collect();
    Ok((
        PyArray1::from_vec(py, tokens).reshape([b, k])?,
        PyArray1::from_vec(py, p.draft_logits).reshape([b, k, v])?,
        match p.confidence {
            Some(c) => Some(PyArray1::from_vec(py, c).reshape([b, k])?),
            None => None,
        },
    ))
}

/// Whether the load plan of `path` against `target_config` shares `(embed_tokens, lm_head)`
/// from the target. Reads headers (and `d2t`) only.
fn plan_sharing(path: &std::path::Path, target: &TargetSpec) -> Result<(bool, bool), Error> {
    let spec = DraftSpec::from_path(path)?;
    let inventory = Inventory::open(path)?;
    let plan = LoadPlan::build(&spec, target, &inventory)?;
    Ok((
        plan.embed_tokens == WeightSource::SharedTarget,
        plan.lm_head == WeightSource::SharedTarget,
    ))
}

fn target_spec(target_config: &str) -> PyResult<TargetSpec> {
    let value: serde_json::Value = serde_json::from_str(target_config).map_err(|e| {
        err(Error::bad_config(
            "<target config>",
            "<root>",
            e.to_string(),
        ))
    })?;
    TargetSpec::from_value(&value, "<target config>").map_err(err)
}

/// The Qwen3-shaped DSpark drafter in candle (native half of `dspark.Drafter`).
#[pyclass(name = "Drafter", module = "dspark._native", frozen)]
pub struct PyDrafter {
    inner: Arc<Qwen3Drafter>,
}

#[pymethods]
impl PyDrafter {
    /// `(embed_shared, lm_head_shared)`: which weights the drafter at `path` takes from the
    /// target described by `target_config` (JSON text).
    #[staticmethod]
    fn plan_sharing(py: Python<'_>, path: PathBuf, target_config: &str) -> PyResult<(bool, bool)> {
        let target = target_spec(target_config)?;
        py.detach(|| plan_sharing(&path, &target)).map_err(err)
    }

    /// Load the drafter at `path` for the target described by `target_config` (JSON text);
    /// `embed_tokens` / `lm_head` are the target's weights, required where the plan shares them.
    #[staticmethod]
    #[pyo3(signature = (path, target_config, embed_tokens = None, lm_head = None))]
    fn load(
        py: Python<'_>,
        path: PathBuf,
        target_config: &str,
        embed_tokens: Option<&Bound<'_, PyAny>>,
        lm_head: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let target = target_spec(target_config)?;
        let (share_embed, share_head) = py.detach(|| plan_sharing(&path, &target)).map_err(err)?;
        let take = |obj: Option<&Bound<'_, PyAny>>, needed: bool, name: &str| match obj {
            Some(o) if needed && !o.is_none() => tensor_f32(o, name).map(Some),
            _ => Ok(None),
        };
        let shared = SharedWeights {
            embed: take(embed_tokens, share_embed, "embed_tokens")?,
            lm_head: take(lm_head, share_head, "lm_head")?,
        };
        let inner = py
            .detach(|| Qwen3Drafter::load(&path, &target, shared))
            .map_err(err)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// `K`: draft tokens per proposal.
    #[getter]
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    /// `K` (same as `block_size`).
    #[getter]
    fn num_draft_tokens(&self) -> usize {
        self.inner.num_draft_tokens()
    }

    /// The noise (mask) token id.
    #[getter]
    fn noise_token_id(&self) -> u32 {
        self.inner.noise_token()
    }

    /// `V_in`.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab().input
    }

    /// `V_d`.
    #[getter]
    fn draft_vocab_size(&self) -> usize {
        self.inner.vocab().draft
    }

    /// `V_t`.
    #[getter]
    fn target_vocab_size(&self) -> usize {
        self.inner.vocab().target
    }

    /// The `d2t` offset table as int64 numpy (`None` for the identity map).
    #[getter]
    fn draft_id_to_target_id<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<i64>>> {
        self.inner
            .id_map()
            .offsets()
            .map(|o| PyArray1::from_vec(py, o))
    }

    /// Whether the checkpoint ships its own `embed_tokens`.
    #[getter]
    fn has_own_embed_tokens(&self) -> bool {
        self.inner.embed_source() == WeightSource::Own
    }

    /// Whether the checkpoint ships its own `lm_head`.
    #[getter]
    fn has_own_lm_head(&self) -> bool {
        self.inner.lm_head_source() == WeightSource::Own
    }

    /// DeepSpec semantics (HF `hidden_states[i+1]`).
    #[getter]
    fn target_layer_ids(&self) -> Vec<i64> {
        self.inner.target_layer_ids().to_vec()
    }

    /// Capture semantics (input of layer `j`).
    #[getter]
    fn capture_layer_ids(&self) -> Vec<usize> {
        self.inner.capture_layer_ids().to_vec()
    }

    /// DeepSpec layout (`True`) or the 1+K layout.
    #[getter]
    fn sample_from_anchor(&self) -> bool {
        self.inner.sample_from_anchor()
    }

    /// Whether proposals carry confidences.
    #[getter]
    fn has_confidence_head(&self) -> bool {
        self.inner.has_confidence_head()
    }

    /// Width of one context feature row, `L·H_t`.
    #[getter]
    fn context_width(&self) -> usize {
        self.inner.context_width()
    }

    /// Markov rank (0 = DFlash).
    #[getter]
    fn markov_rank(&self) -> usize {
        self.inner.markov_rank()
    }

    /// `(code, message)` of every non-fatal finding from config and load plan.
    #[getter]
    fn warnings(&self) -> Vec<(String, String)> {
        self.inner
            .warnings()
            .iter()
            .map(|w| (w.code.to_string(), w.message.clone()))
            .collect()
    }

    /// Stateless drafting over `context` `[B, T, L·H_t]`.
    #[pyo3(signature = (context, anchors, *, start_positions = None, temperature = 0.0, seed = None, top_k = None))]
    #[allow(clippy::too_many_arguments)]
    fn propose<'py>(
        &self,
        py: Python<'py>,
        context: &Bound<'py, PyAny>,
        anchors: &Bound<'py, PyAny>,
        start_positions: Option<&Bound<'py, PyAny>>,
        temperature: f32,
        seed: Option<&Bound<'py, PyAny>>,
        top_k: Option<usize>,
    ) -> PyResult<ProposalArrays<'py>> {
        let ctx = tensor_f32(context, "context_hidden_states")?;
        let anchors = ids_u32(anchors, "anchors")?;
        let starts: Vec<usize> = match start_positions {
            None => vec![0],
            Some(s) => one_or_many(s, "start_positions")?
                .into_iter()
                .map(|x| x as usize)
                .collect(),
        };
        let none = py.None().into_bound(py);
        let opts = options(temperature, seed.unwrap_or(&none), top_k)?;
        let inner = &self.inner;
        let p = py
            .detach(|| inner.propose(&ctx, &anchors, &starts, &opts))
            .map_err(err)?;
        arrays(py, p)
    }

    /// A fresh, empty per-request state.
    fn new_state(&self) -> PyDraftState {
        PyDraftState {
            drafter: Arc::clone(&self.inner),
            state: self.inner.new_state(),
        }
    }

    /// Draft one block per state (anchor `b` at `states[b].length + states[b].start`).
    #[pyo3(signature = (states, anchors, *, temperature = 0.0, seed = None, top_k = None))]
    fn propose_states<'py>(
        &self,
        py: Python<'py>,
        states: Vec<PyRef<'py, PyDraftState>>,
        anchors: &Bound<'py, PyAny>,
        temperature: f32,
        seed: Option<&Bound<'py, PyAny>>,
        top_k: Option<usize>,
    ) -> PyResult<ProposalArrays<'py>> {
        if let Some(i) = states
            .iter()
            .position(|s| !Arc::ptr_eq(&s.drafter, &self.inner))
        {
            return Err(err(Error::invalid(
                "states",
                format!("state {i} was made by another drafter"),
            )));
        }
        let anchors = ids_u32(anchors, "anchors")?;
        let none = py.None().into_bound(py);
        let opts = options(temperature, seed.unwrap_or(&none), top_k)?;
        let refs: Vec<&DraftState> = states.iter().map(|s| &s.state).collect();
        let inner = &self.inner;
        let p = py
            .detach(|| inner.propose_cached(&refs, &anchors, &opts))
            .map_err(err)?;
        arrays(py, p)
    }
}

/// One request's context KV cache (native half of `dspark.DraftState`).
#[pyclass(name = "DraftState", module = "dspark._native")]
pub struct PyDraftState {
    drafter: Arc<Qwen3Drafter>,
    state: DraftState,
}

#[pymethods]
impl PyDraftState {
    /// Append features `[T, L·H_t]` at absolute positions `start_position ..`.
    fn extend(
        &mut self,
        py: Python<'_>,
        features: &Bound<'_, PyAny>,
        start_position: usize,
    ) -> PyResult<()> {
        let f = tensor_f32(features, "features")?;
        let (drafter, state) = (&self.drafter, &mut self.state);
        py.detach(|| drafter.extend(state, &f, start_position))
            .map_err(err)
    }

    /// Keep the first `n` cached positions.
    fn truncate(&mut self, n: usize) -> PyResult<()> {
        self.state.truncate(n).map_err(err)
    }

    /// Drop everything.
    fn clear(&mut self) {
        self.state.clear();
    }

    /// Number of cached context positions.
    #[getter]
    fn length(&self) -> usize {
        self.state.len()
    }

    /// Absolute position of the first cached row.
    #[getter]
    fn start(&self) -> usize {
        self.state.start()
    }

    /// One past the last cached position (where the next anchor sits).
    #[getter]
    fn end(&self) -> usize {
        self.state.end()
    }

    fn __len__(&self) -> usize {
        self.state.len()
    }
}

/// Register the classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDrafter>()?;
    m.add_class::<PyDraftState>()?;
    Ok(())
}
