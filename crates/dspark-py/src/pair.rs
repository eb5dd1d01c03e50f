//! The target and drafter a Python `Speculator` drives: native (candle) or Python objects,
//! behind one type each so the engine's loop is compiled once for the glue.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use dspark::drafter::{DraftState, Proposal, ProposeOptions};
use dspark::models::qwen3::{Qwen3Cache, Qwen3Target};
use dspark::policy::VerifyPolicy;
use dspark::speculator::{TargetInput, TargetModel, TargetOutput};
use dspark::{Drafter, DrafterInfo, Error, IdMap, Qwen3Drafter, Result};
use pyo3::prelude::*;

use crate::bridge::{PyTarget, PyTargetCache};
use crate::bridge_drafter::PyDraftModel;
use crate::drafter::PyDrafter;
use crate::errors::err;
use crate::kernels::sps_table;
use crate::native_target::PyNativeTarget;

/// A `dspark.NativeTarget` runs natively; any other object through the `TargetModel`
/// protocol.
pub fn target_of(obj: &Bound<'_, PyAny>) -> PyResult<AnyTarget> {
    Ok(match obj.cast::<PyNativeTarget>() {
        Ok(t) => AnyTarget::Native(Arc::clone(&t.get().inner)),
        Err(_) => AnyTarget::Py(PyTarget::new(obj)?),
    })
}

/// A `dspark.Drafter` runs natively; any other object through the drafter protocol
/// (`target_hidden`: the target's hidden size).
pub fn drafter_of(obj: &Bound<'_, PyAny>, target_hidden: usize) -> PyResult<AnyDrafter> {
    Ok(match obj.cast::<PyDrafter>() {
        Ok(d) => AnyDrafter::Native(d.get().shared()),
        Err(_) => AnyDrafter::Py(PyDraftModel::new(obj, target_hidden)?),
    })
}

/// The verify policy from its Python spelling.
pub fn policy(
    verify: &str,
    threshold: Option<f64>,
    steps_per_second: Option<&Bound<'_, PyAny>>,
    steps_interpolation: Option<&Bound<'_, PyAny>>,
) -> PyResult<VerifyPolicy> {
    Ok(match (verify, threshold, steps_per_second) {
        ("full", _, _) => VerifyPolicy::Full,
        ("threshold", Some(t), _) => VerifyPolicy::Threshold(t as f32),
        ("scheduled", _, Some(t)) if !t.is_none() => {
            VerifyPolicy::Scheduled(sps_table(t, steps_interpolation)?)
        }
        ("scheduled", _, _) => VerifyPolicy::ScheduledMeasured,
        ("pipelined", _, Some(t)) if !t.is_none() => {
            VerifyPolicy::Pipelined(sps_table(t, steps_interpolation)?)
        }
        (other, _, _) => {
            return Err(err(Error::invalid(
                "verify",
                format!(
                    "{other:?}: 'full', 'threshold' (with a threshold), 'scheduled' or \
                     'pipelined' (with steps_per_second)"
                ),
            )));
        }
    })
}

/// A native target or a Python one.
pub enum AnyTarget {
    /// `dspark.NativeTarget`.
    Native(Arc<Qwen3Target>),
    /// A Python `TargetModel`.
    Py(PyTarget),
}

/// The cache of an [`AnyTarget`].
pub enum AnyCache {
    /// Native.
    Native(Qwen3Cache),
    /// Python.
    Py(PyTargetCache),
}

fn wrong() -> Error {
    Error::Internal {
        message: "a cache was handed to a target of the other kind".into(),
    }
}

impl TargetModel for AnyTarget {
    type Cache = AnyCache;

    fn vocab_size(&self) -> usize {
        match self {
            AnyTarget::Native(t) => t.vocab_size(),
            AnyTarget::Py(t) => t.vocab_size(),
        }
    }

    fn num_hidden_layers(&self) -> usize {
        match self {
            AnyTarget::Native(t) => t.num_hidden_layers(),
            AnyTarget::Py(t) => t.num_hidden_layers(),
        }
    }

    fn hidden_size(&self) -> usize {
        match self {
            AnyTarget::Native(t) => t.hidden_size(),
            AnyTarget::Py(t) => t.hidden_size(),
        }
    }

    fn device(&self) -> Device {
        match self {
            AnyTarget::Native(t) => t.device(),
            AnyTarget::Py(t) => t.device(),
        }
    }

    fn new_cache(&self, batch: usize) -> Result<AnyCache> {
        Ok(match self {
            AnyTarget::Native(t) => AnyCache::Native(t.new_cache(batch)?),
            AnyTarget::Py(t) => AnyCache::Py(t.new_cache(batch)?),
        })
    }

    fn forward(
        &self,
        cache: &mut AnyCache,
        input: &TargetInput<'_>,
        capture_layer_ids: &[usize],
    ) -> Result<TargetOutput> {
        match (self, cache) {
            (AnyTarget::Native(t), AnyCache::Native(c)) => t.forward(c, input, capture_layer_ids),
            (AnyTarget::Py(t), AnyCache::Py(c)) => t.forward(c, input, capture_layer_ids),
            _ => Err(wrong()),
        }
    }

    fn truncate(&self, cache: &mut AnyCache, lengths: &[usize]) -> Result<()> {
        match (self, cache) {
            (AnyTarget::Native(t), AnyCache::Native(c)) => t.truncate(c, lengths),
            (AnyTarget::Py(t), AnyCache::Py(c)) => t.truncate(c, lengths),
            _ => Err(wrong()),
        }
    }

    fn cache_lengths(&self, cache: &AnyCache) -> Vec<usize> {
        match (self, cache) {
            (AnyTarget::Native(t), AnyCache::Native(c)) => t.cache_lengths(c),
            (AnyTarget::Py(t), AnyCache::Py(c)) => t.cache_lengths(c),
            _ => Vec::new(),
        }
    }

    fn resizable(&self) -> bool {
        match self {
            AnyTarget::Native(t) => t.resizable(),
            AnyTarget::Py(t) => t.resizable(),
        }
    }

    fn grow(&self, cache: &mut AnyCache, n: usize) -> Result<()> {
        match (self, cache) {
            (AnyTarget::Native(t), AnyCache::Native(c)) => t.grow(c, n),
            (AnyTarget::Py(t), AnyCache::Py(c)) => t.grow(c, n),
            _ => Err(wrong()),
        }
    }

    fn retain(&self, cache: &mut AnyCache, keep: &[bool]) -> Result<()> {
        match (self, cache) {
            (AnyTarget::Native(t), AnyCache::Native(c)) => t.retain(c, keep),
            (AnyTarget::Py(t), AnyCache::Py(c)) => t.retain(c, keep),
            _ => Err(wrong()),
        }
    }

    fn ragged(&self) -> bool {
        match self {
            AnyTarget::Native(t) => t.ragged(),
            AnyTarget::Py(t) => t.ragged(),
        }
    }

    fn forward_cost(&self) -> Result<Option<dspark::models::ForwardCost>> {
        match self {
            AnyTarget::Native(t) => t.forward_cost(),
            AnyTarget::Py(t) => t.forward_cost(),
        }
    }
}

/// The candle drafter or a Python one.
pub enum AnyDrafter {
    /// `dspark.Drafter`.
    Native(Arc<Qwen3Drafter>),
    /// A Python drafter (`dspark.TorchDrafter`, test oracles, …).
    Py(PyDraftModel),
}

/// The state of an [`AnyDrafter`].
pub enum AnyState {
    /// Native.
    Native(DraftState),
    /// Python.
    Py(Py<PyAny>),
}

macro_rules! each {
    ($self:ident, $d:ident => $e:expr) => {
        match $self {
            AnyDrafter::Native($d) => $e,
            AnyDrafter::Py($d) => $e,
        }
    };
}

/// The native states of a batch (`wrong()` when one is a Python drafter's).
fn native_states<'a>(states: &[&'a AnyState]) -> Result<Vec<&'a DraftState>> {
    states
        .iter()
        .map(|s| match s {
            AnyState::Native(s) => Ok(s),
            AnyState::Py(_) => Err(wrong()),
        })
        .collect()
}

/// The Python states of a batch (`wrong()` when one is a native drafter's).
fn py_states<'a>(states: &[&'a AnyState]) -> Result<Vec<&'a Py<PyAny>>> {
    states
        .iter()
        .map(|s| match s {
            AnyState::Py(s) => Ok(s),
            AnyState::Native(_) => Err(wrong()),
        })
        .collect()
}

impl Drafter for AnyDrafter {
    type State = AnyState;

    fn info(&self) -> &DrafterInfo {
        each!(self, d => d.info())
    }

    fn id_map(&self) -> &IdMap {
        each!(self, d => d.id_map())
    }

    fn new_state(&self) -> Result<AnyState> {
        Ok(match self {
            AnyDrafter::Native(d) => AnyState::Native(d.new_state()?),
            AnyDrafter::Py(d) => AnyState::Py(d.new_state()?),
        })
    }

    fn extend(&self, state: &mut AnyState, features: &Tensor, start: usize) -> Result<()> {
        match (self, state) {
            (AnyDrafter::Native(d), AnyState::Native(s)) => d.extend(s, features, start),
            (AnyDrafter::Py(d), AnyState::Py(s)) => d.extend(s, features, start),
            _ => Err(wrong()),
        }
    }

    fn truncate(&self, state: &mut AnyState, len: usize) -> Result<()> {
        match (self, state) {
            (AnyDrafter::Native(d), AnyState::Native(s)) => Drafter::truncate(&**d, s, len),
            (AnyDrafter::Py(d), AnyState::Py(s)) => d.truncate(s, len),
            _ => Err(wrong()),
        }
    }

    fn state_end(&self, state: &AnyState) -> usize {
        match (self, state) {
            (AnyDrafter::Native(d), AnyState::Native(s)) => d.state_end(s),
            (AnyDrafter::Py(d), AnyState::Py(s)) => d.state_end(s),
            _ => 0,
        }
    }

    fn propose_cached(
        &self,
        states: &[&AnyState],
        anchors: &[u32],
        opts: &ProposeOptions,
    ) -> Result<Proposal> {
        match self {
            AnyDrafter::Native(d) => d.propose_cached(&native_states(states)?, anchors, opts),
            AnyDrafter::Py(d) => d.propose_cached(&py_states(states)?, anchors, opts),
        }
    }

    // Forwarded, not left to the trait's default: a device drafter keeps its draft logits on
    // the device for verification (the default would copy them to the host every round).
    fn propose_for_verify(
        &self,
        states: &[&AnyState],
        anchors: &[u32],
        opts: &ProposeOptions,
    ) -> Result<(Proposal, Option<Tensor>)> {
        match self {
            AnyDrafter::Native(d) => d.propose_for_verify(&native_states(states)?, anchors, opts),
            AnyDrafter::Py(d) => d.propose_for_verify(&py_states(states)?, anchors, opts),
        }
    }

    // Forwarded: a native drafter on a device drafts a stateless batch in one pass.
    fn propose(
        &self,
        context: &Tensor,
        anchors: &[u32],
        start_positions: &[usize],
        opts: &ProposeOptions,
    ) -> Result<Proposal> {
        each!(self, d => d.propose(context, anchors, start_positions, opts))
    }
}
