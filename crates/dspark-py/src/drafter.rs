//! Thin bindings of the candle drafter (`dspark::drafter`): `Drafter` and `DraftState`.
//!
//! Tensors arrive through DLPack (CPU, C-contiguous, float32/float16/bfloat16 features; integer
//! ids) and are copied once into `f32` candle tensors; the GIL is released around all Rust work.
//! Results are fresh numpy arrays; `python/dspark/drafter.py` wraps them (torch when available)
//! and does the HF-model unpacking.

use std::sync::Arc;

use numpy::PyArray1;
use pyo3::prelude::*;

use dspark::device::{device_name, parse_device};
use dspark::{
    DraftState, Drafter, Error, LoadOptions, Qwen3Drafter, SharedWeights, TargetModel, WeightSource,
};

use crate::args;
use crate::drafter_args::{
    ProposalArrays, Sts, arrays, check_output, ids_u32, options, plan_sharing, start_positions_of,
    target_spec, tensor_f32,
};
use crate::errors::{err, guard};

/// The Qwen3-shaped DSpark drafter in candle (native half of `dspark.Drafter`).
#[pyclass(name = "Drafter", module = "dspark._native", frozen)]
pub struct PyDrafter {
    inner: Arc<Qwen3Drafter>,
}

impl PyDrafter {
    /// The engine drafter (shared, no copy).
    pub(crate) fn shared(&self) -> Arc<Qwen3Drafter> {
        Arc::clone(&self.inner)
    }
}

#[pymethods]
impl PyDrafter {
    /// Load the drafter at `path` for a native target, sharing its embed / lm_head (no copy),
    /// on the target's device (`device`, when given, must name it).
    #[staticmethod]
    #[pyo3(signature = (path, target, sts = None, device = None, dtype = None))]
    fn load_native(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        target: &Bound<'_, crate::native_target::PyNativeTarget>,
        sts: Option<&Bound<'_, PyAny>>,
        device: Option<&str>,
        dtype: Option<&str>,
    ) -> PyResult<Self> {
        guard(|| {
            let path = args::path(path, "path")?;
            let options = LoadOptions::with_dtype_name(dtype).map_err(err)?;
            let t = &target.get().inner;
            let on = t.device();
            if let Some(spec) = device {
                let asked = parse_device("device", spec).map_err(err)?;
                if !asked.same_device(&on) {
                    return Err(err(Error::DeviceMismatch {
                        name: "device".into(),
                        found: device_name(&asked),
                        expected: device_name(&on),
                    }));
                }
            }
            let sts = Sts::from_py(sts)?;
            let inner = sts.load(
                py,
                &path,
                &t.target_spec(),
                t.shared_weights(),
                &on,
                options,
            )?;
            Ok(Self {
                inner: Arc::new(inner),
            })
        })
    }

    /// `(embed_shared, lm_head_shared)`: which weights the drafter at `path` takes from the
    /// target described by `target_config` (JSON text).
    #[staticmethod]
    fn plan_sharing(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        target_config: &Bound<'_, PyAny>,
    ) -> PyResult<(bool, bool)> {
        guard(|| {
            let path = args::path(path, "path")?;
            let target = target_spec(&args::string(target_config, "target_config")?)?;
            py.detach(|| plan_sharing(&path, &target)).map_err(err)
        })
    }

    /// Load the drafter at `path` for the target described by `target_config` (JSON text);
    /// `embed_tokens` / `lm_head` are the target's weights, required where the plan shares them.
    #[staticmethod]
    #[pyo3(signature = (path, target_config, embed_tokens = None, lm_head = None, sts = None, device = "cpu", dtype = None))]
    #[allow(clippy::too_many_arguments)]
    fn load(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        target_config: &Bound<'_, PyAny>,
        embed_tokens: Option<&Bound<'_, PyAny>>,
        lm_head: Option<&Bound<'_, PyAny>>,
        sts: Option<&Bound<'_, PyAny>>,
        device: &str,
        dtype: Option<&str>,
    ) -> PyResult<Self> {
        guard(|| {
            let path = args::path(path, "path")?;
            let device = parse_device("device", device).map_err(err)?;
            let options = LoadOptions::with_dtype_name(dtype).map_err(err)?;
            let target = target_spec(&args::string(target_config, "target_config")?)?;
            let (share_embed, share_head) =
                py.detach(|| plan_sharing(&path, &target)).map_err(err)?;
            let take = |obj: Option<&Bound<'_, PyAny>>, needed: bool, name: &str| match obj {
                Some(o) if needed && !o.is_none() => tensor_f32(o, name).map(|t| Some(t.into())),
                _ => Ok(None),
            };
            let shared = SharedWeights {
                embed: take(embed_tokens, share_embed, "embed_tokens")?,
                lm_head: take(lm_head, share_head, "lm_head")?,
                head: None,
            };
            let inner = Sts::from_py(sts)?.load(py, &path, &target, shared, &device, options)?;
            Ok(Self {
                inner: Arc::new(inner),
            })
        })
    }

    /// Where the drafter runs: `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> PyResult<String> {
        guard(|| Ok(device_name(self.inner.device())))
    }

    /// The confidence calibration's temperatures, or `None`.
    #[getter]
    fn sts_temperatures(&self) -> PyResult<Option<Vec<f32>>> {
        guard(|| Ok(self.inner.sts().map(|s| s.temperatures.clone())))
    }

    /// `K`: draft tokens per proposal.
    #[getter]
    fn block_size(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.info().block_size))
    }

    /// `K` (same as `block_size`).
    #[getter]
    fn num_draft_tokens(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.info().num_draft_tokens))
    }

    /// The noise (mask) token id.
    #[getter]
    fn noise_token_id(&self) -> PyResult<u32> {
        guard(|| Ok(self.inner.info().noise_token))
    }

    /// `V_in`.
    #[getter]
    fn vocab_size(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.info().vocab.input))
    }

    /// `V_d`.
    #[getter]
    fn draft_vocab_size(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.info().vocab.draft))
    }

    /// `V_t`.
    #[getter]
    fn target_vocab_size(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.info().vocab.target))
    }

    /// The `d2t` offset table as int64 numpy (`None` for the identity map).
    #[getter]
    fn draft_id_to_target_id<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, PyArray1<i64>>>> {
        guard(|| {
            Ok(self
                .inner
                .id_map()
                .offsets()
                .map(|o| PyArray1::from_vec(py, o)))
        })
    }

    /// Whether the checkpoint ships its own `embed_tokens`.
    #[getter]
    fn has_own_embed_tokens(&self) -> PyResult<bool> {
        guard(|| Ok(self.inner.info().embed_source == WeightSource::Own))
    }

    /// Whether the checkpoint ships its own `lm_head`.
    #[getter]
    fn has_own_lm_head(&self) -> PyResult<bool> {
        guard(|| Ok(self.inner.info().lm_head_source == WeightSource::Own))
    }

    /// DeepSpec semantics (HF `hidden_states[i+1]`).
    #[getter]
    fn target_layer_ids(&self) -> PyResult<Vec<i64>> {
        guard(|| Ok(self.inner.info().target_layer_ids.as_slice().to_vec()))
    }

    /// Capture semantics (input of layer `j`).
    #[getter]
    fn capture_layer_ids(&self) -> PyResult<Vec<usize>> {
        guard(|| Ok(self.inner.info().capture_layer_ids.as_slice().to_vec()))
    }

    /// DeepSpec layout (`True`) or the 1+K layout.
    #[getter]
    fn sample_from_anchor(&self) -> PyResult<bool> {
        guard(|| Ok(self.inner.info().sample_from_anchor))
    }

    /// Whether proposals carry confidences.
    #[getter]
    fn has_confidence_head(&self) -> PyResult<bool> {
        guard(|| Ok(self.inner.info().has_confidence_head))
    }

    /// Width of one context feature row, `L·H_t`.
    #[getter]
    fn context_width(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.info().context_width))
    }

    /// Markov rank (0 = DFlash).
    #[getter]
    fn markov_rank(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.markov_rank()))
    }

    /// `(code, message)` of every non-fatal finding from config and load plan.
    #[getter]
    fn warnings(&self) -> PyResult<Vec<(String, String)>> {
        guard(|| {
            Ok(self
                .inner
                .warnings()
                .iter()
                .map(|w| (w.code.to_string(), w.message.clone()))
                .collect())
        })
    }

    /// Stateless drafting over `context` `[B, T, L·H_t]`: `(tokens [B,K] int64, draft_logits
    /// [B,K,V_t] float32, confidence [B,K] float32 | None)`. A CUDA `context` on the drafter's
    /// device is read in place (DLPack) and the draft logits stay there (a DLPack array); only
    /// tokens and confidences cross to the host.
    #[pyo3(signature = (context, anchors, *, start_positions = None, temperature = None, seed = None, top_k = None))]
    #[allow(clippy::too_many_arguments)]
    fn propose<'py>(
        &self,
        py: Python<'py>,
        context: &Bound<'py, PyAny>,
        anchors: &Bound<'py, PyAny>,
        start_positions: Option<&Bound<'py, PyAny>>,
        temperature: Option<&Bound<'py, PyAny>>,
        seed: Option<&Bound<'py, PyAny>>,
        top_k: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        guard(|| {
            let opts = options(temperature, seed, top_k)?;
            let starts = start_positions_of(start_positions)?;
            let inner = &self.inner;
            let anchors = ids_u32(anchors, "anchors", inner.info().vocab.target)?;
            check_output(inner, anchors.len())?;
            #[cfg(feature = "cuda")]
            if let Some(on) = crate::dlpack::cuda::cuda_device_of(context, "context_hidden_states")?
            {
                // Read in place only on the drafter's own device; never a silent copy.
                if !on.same_device(inner.device()) {
                    return Err(err(Error::DeviceMismatch {
                        name: "context_hidden_states".into(),
                        found: device_name(&on),
                        expected: device_name(inner.device()),
                    }));
                }
                return crate::drafter_args::propose_device(
                    py, inner, context, &anchors, &starts, &opts,
                );
            }
            let ctx = tensor_f32(context, "context_hidden_states")?;
            let p = py
                .detach(|| inner.propose(&ctx, &anchors, &starts, &opts))
                .map_err(err)?;
            Ok(arrays(py, p)?.into_pyobject(py)?.into_any())
        })
    }

    /// A fresh, empty per-request state.
    fn new_state(&self) -> PyResult<PyDraftState> {
        guard(|| {
            Ok(PyDraftState {
                drafter: Arc::clone(&self.inner),
                state: self.inner.new_state().map_err(err)?,
            })
        })
    }

    /// Draft one block per state (anchor `b` at `states[b].length + states[b].start`).
    #[pyo3(signature = (states, anchors, *, temperature = None, seed = None, top_k = None))]
    fn propose_states<'py>(
        &self,
        py: Python<'py>,
        states: &Bound<'py, PyAny>,
        anchors: &Bound<'py, PyAny>,
        temperature: Option<&Bound<'py, PyAny>>,
        seed: Option<&Bound<'py, PyAny>>,
        top_k: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<ProposalArrays<'py>> {
        guard(|| {
            let opts = options(temperature, seed, top_k)?;
            if !args::is_sequence(states) {
                return Err(err(Error::invalid(
                    "states",
                    format!(
                        "expected a list of DraftState, got {}",
                        args::type_name(states)
                    ),
                )));
            }
            let mut held = Vec::new();
            for (i, item) in states.try_iter()?.enumerate() {
                let item = item?;
                let state = item.cast::<PyDraftState>().map_err(|_| {
                    err(Error::invalid(
                        "states",
                        format!("item {i} is a {}, not a DraftState", args::type_name(&item)),
                    ))
                })?;
                let state = state.try_borrow().map_err(|_| {
                    err(Error::invalid(
                        "states",
                        format!("state {i} is being changed by another thread"),
                    ))
                })?;
                if !Arc::ptr_eq(&state.drafter, &self.inner) {
                    return Err(err(Error::invalid(
                        "states",
                        format!("state {i} was made by another drafter"),
                    )));
                }
                held.push(state);
            }
            let inner = &self.inner;
            let anchors = ids_u32(anchors, "anchors", inner.info().vocab.target)?;
            check_output(inner, anchors.len())?;
            let refs: Vec<&DraftState> = held.iter().map(|s| &s.state).collect();
            let p = py
                .detach(|| inner.propose_cached(&refs, &anchors, &opts))
                .map_err(err)?;
            drop(refs);
            drop(held);
            arrays(py, p)
        })
    }
}

/// One request's context KV cache (native half of `dspark.DraftState`).
#[pyclass(name = "DraftState", module = "dspark._native")]
pub struct PyDraftState {
    drafter: Arc<Qwen3Drafter>,
    state: DraftState,
}

/// Borrow a state mutably, refusing (typed) while another thread uses it.
fn state_mut<'py>(slf: &Bound<'py, PyDraftState>) -> PyResult<PyRefMut<'py, PyDraftState>> {
    slf.try_borrow_mut().map_err(|_| {
        err(Error::invalid(
            "state",
            "this DraftState is in use by another thread",
        ))
    })
}

fn state_ref<'py>(slf: &Bound<'py, PyDraftState>) -> PyResult<PyRef<'py, PyDraftState>> {
    slf.try_borrow().map_err(|_| {
        err(Error::invalid(
            "state",
            "this DraftState is being changed by another thread",
        ))
    })
}

#[pymethods]
impl PyDraftState {
    /// Append features `[T, L·H_t]` at absolute positions `start_position ..`.
    fn extend(
        slf: &Bound<'_, Self>,
        features: &Bound<'_, PyAny>,
        start_position: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        guard(|| {
            let py = slf.py();
            let start_position = args::usize_at_most(start_position, "start_position", u64::MAX)?;
            let f = tensor_f32(features, "features")?;
            let mut this = state_mut(slf)?;
            let this = &mut *this;
            let (drafter, state) = (&this.drafter, &mut this.state);
            py.detach(|| drafter.extend(state, &f, start_position))
                .map_err(err)
        })
    }

    /// Keep the first `n` cached positions.
    fn truncate(slf: &Bound<'_, Self>, n: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            let n = args::usize_at_most(n, "n", u64::MAX)?;
            state_mut(slf)?.state.truncate(n).map_err(err)
        })
    }

    /// Drop everything.
    fn clear(slf: &Bound<'_, Self>) -> PyResult<()> {
        guard(|| {
            state_mut(slf)?.state.clear();
            Ok(())
        })
    }

    /// Number of cached context positions.
    #[getter]
    fn length(slf: &Bound<'_, Self>) -> PyResult<usize> {
        guard(|| Ok(state_ref(slf)?.state.len()))
    }

    /// Absolute position of the first cached row.
    #[getter]
    fn start(slf: &Bound<'_, Self>) -> PyResult<usize> {
        guard(|| Ok(state_ref(slf)?.state.start()))
    }

    /// One past the last cached position (where the next anchor sits).
    #[getter]
    fn end(slf: &Bound<'_, Self>) -> PyResult<usize> {
        guard(|| Ok(state_ref(slf)?.state.end()))
    }

    fn __len__(slf: &Bound<'_, Self>) -> PyResult<usize> {
        guard(|| Ok(state_ref(slf)?.state.len()))
    }
}

/// Register the classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDrafter>()?;
    m.add_class::<PyDraftState>()?;
    Ok(())
}
