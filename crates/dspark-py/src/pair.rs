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

/// `$e` on whichever model the `$kind` enum `$any` holds (native or Python), bound to `$m`.
macro_rules! each {
    ($kind:ident, $any:expr, |$m:ident| $e:expr) => {
        match $any {
            $kind::Native($m) => $e,
            $kind::Py($m) => $e,
        }
    };
}

/// `$e` on the model `$any` (a `$kind`) and its `$state` `$st` (bound to `$m` and `$s`) when
/// both are of one kind; `$other` when they are not.
macro_rules! each_with {
    (
        $kind:ident, $state:ident; $any:expr, $st:expr =>
        |$m:ident, $s:ident| $e:expr; else $other:expr
    ) => {
        match ($any, $st) {
            ($kind::Native($m), $state::Native($s)) => $e,
            ($kind::Py($m), $state::Py($s)) => $e,
            _ => $other,
        }
    };
}

impl TargetModel for AnyTarget {
    type Cache = AnyCache;

    fn vocab_size(&self) -> usize {
        each!(AnyTarget, self, |t| t.vocab_size())
    }

    fn num_hidden_layers(&self) -> usize {
        each!(AnyTarget, self, |t| t.num_hidden_layers())
    }

    fn hidden_size(&self) -> usize {
        each!(AnyTarget, self, |t| t.hidden_size())
    }

    fn device(&self) -> Device {
        each!(AnyTarget, self, |t| t.device())
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
        each_with!(AnyTarget, AnyCache; self, cache =>
            |t, c| t.forward(c, input, capture_layer_ids); else Err(wrong()))
    }

    fn truncate(&self, cache: &mut AnyCache, lengths: &[usize]) -> Result<()> {
        each_with!(AnyTarget, AnyCache; self, cache =>
            |t, c| t.truncate(c, lengths); else Err(wrong()))
    }

    fn cache_lengths(&self, cache: &AnyCache) -> Vec<usize> {
        each_with!(AnyTarget, AnyCache; self, cache => |t, c| t.cache_lengths(c); else Vec::new())
    }

    fn resizable(&self) -> bool {
        each!(AnyTarget, self, |t| t.resizable())
    }

    fn grow(&self, cache: &mut AnyCache, n: usize) -> Result<()> {
        each_with!(AnyTarget, AnyCache; self, cache => |t, c| t.grow(c, n); else Err(wrong()))
    }

    fn retain(&self, cache: &mut AnyCache, keep: &[bool]) -> Result<()> {
        each_with!(AnyTarget, AnyCache; self, cache => |t, c| t.retain(c, keep); else Err(wrong()))
    }

    fn ragged(&self) -> bool {
        each!(AnyTarget, self, |t| t.ragged())
    }

    fn forward_cost(&self) -> Result<Option<dspark::models::ForwardCost>> {
        each!(AnyTarget, self, |t| t.forward_cost())
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
        each!(AnyDrafter, self, |d| d.info())
    }

    fn id_map(&self) -> &IdMap {
        each!(AnyDrafter, self, |d| d.id_map())
    }

    fn new_state(&self) -> Result<AnyState> {
        Ok(match self {
            AnyDrafter::Native(d) => AnyState::Native(d.new_state()?),
            AnyDrafter::Py(d) => AnyState::Py(d.new_state()?),
        })
    }

    fn extend(&self, state: &mut AnyState, features: &Tensor, start: usize) -> Result<()> {
        each_with!(AnyDrafter, AnyState; self, state =>
            |d, s| d.extend(s, features, start); else Err(wrong()))
    }

    fn truncate(&self, state: &mut AnyState, len: usize) -> Result<()> {
        each_with!(AnyDrafter, AnyState; self, state =>
            |d, s| Drafter::truncate(d, s, len); else Err(wrong()))
    }

    fn state_end(&self, state: &AnyState) -> usize {
        each_with!(AnyDrafter, AnyState; self, state => |d, s| d.state_end(s); else 0)
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

    fn propose_cost(&self) -> Result<Option<dspark::models::ForwardCost>> {
        each!(AnyDrafter, self, |d| d.propose_cost())
    }

    // Forwarded: a native drafter on a device drafts a stateless batch in one pass.
    fn propose(
        &self,
        context: &Tensor,
        anchors: &[u32],
        start_positions: &[usize],
        opts: &ProposeOptions,
    ) -> Result<Proposal> {
        each!(AnyDrafter, self, |d| d.propose(
            context,
            anchors,
            start_positions,
            opts
        ))
    }
}
