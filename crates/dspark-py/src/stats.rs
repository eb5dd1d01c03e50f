//! `dspark.SpeculationStats`: the engine's [`Stats`] behind read-only getters. The derived
//! figures (τ, per-position acceptance) are the engine's own methods, computed once there.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use dspark::speculator::Stats;

/// What a generation did: rounds, drafted / accepted / committed tokens, acceptance per draft
/// position and the time split (seconds).
#[pyclass(name = "SpeculationStats", module = "dspark", frozen)]
#[derive(Clone)]
pub struct PyStats(pub Stats);

#[pymethods]
impl PyStats {
    /// Speculative rounds (one batched draft + verify each).
    #[getter]
    fn rounds(&self) -> usize {
        self.0.rounds
    }

    /// Of `rounds`, those in which a scheduling policy drafted nothing (one target-only step
    /// per request).
    #[getter]
    fn plain_rounds(&self) -> usize {
        self.0.plain_rounds
    }

    /// Sum over requests of the rounds each took part in.
    #[getter]
    fn request_rounds(&self) -> usize {
        self.0.request_rounds
    }

    /// Tokens committed by rounds (accepted drafts + correction/bonus).
    #[getter]
    fn committed_tokens(&self) -> usize {
        self.0.committed_tokens
    }

    /// Draft tokens sent to verification.
    #[getter]
    fn drafted_tokens(&self) -> usize {
        self.0.drafted_tokens
    }

    /// Draft tokens accepted.
    #[getter]
    fn accepted_tokens(&self) -> usize {
        self.0.accepted_tokens
    }

    /// Per draft position k: how often it was verified after all earlier drafts were accepted.
    #[getter]
    fn position_attempts(&self) -> Vec<usize> {
        self.0.position_attempts.clone()
    }

    /// Per draft position k: how often it was then accepted.
    #[getter]
    fn position_accepts(&self) -> Vec<usize> {
        self.0.position_accepts.clone()
    }

    /// Seconds in the drafter (proposals, context extension).
    #[getter]
    fn drafter_seconds(&self) -> f64 {
        self.0.drafter_seconds
    }

    /// Seconds in target forwards.
    #[getter]
    fn target_seconds(&self) -> f64 {
        self.0.target_seconds
    }

    /// Seconds in kernels and bookkeeping.
    #[getter]
    fn kernel_seconds(&self) -> f64 {
        self.0.kernel_seconds
    }

    /// Wall time of the call (the streaming hook excluded).
    #[getter]
    fn total_seconds(&self) -> f64 {
        self.0.total_seconds
    }

    /// Of `total_seconds`, the time to first token; the rest is the decode phase.
    #[getter]
    fn prefill_seconds(&self) -> f64 {
        self.0.prefill_seconds
    }

    /// `(position, confidence, accepted)` of every verified slot whose earlier slots were all
    /// accepted (only with `record_confidence=True`).
    #[getter]
    fn confidence_records(&self) -> Vec<(u32, f32, bool)> {
        self.0
            .confidence_records
            .iter()
            .map(|r| (r.position, r.confidence, r.accepted))
            .collect()
    }

    /// τ: mean tokens committed per request-round (accepted drafts + 1).
    #[getter]
    fn acceptance_length(&self) -> f64 {
        self.0.acceptance_length()
    }

    /// Conditional acceptance rate of draft position k given positions < k were accepted
    /// (NaN where never attempted).
    #[getter]
    fn per_position_acceptance(&self) -> Vec<f64> {
        self.0.per_position_acceptance()
    }

    /// Every field (and the two derived figures) as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("rounds", self.rounds())?;
        d.set_item("plain_rounds", self.plain_rounds())?;
        d.set_item("request_rounds", self.request_rounds())?;
        d.set_item("committed_tokens", self.committed_tokens())?;
        d.set_item("drafted_tokens", self.drafted_tokens())?;
        d.set_item("accepted_tokens", self.accepted_tokens())?;
        d.set_item("position_attempts", self.position_attempts())?;
        d.set_item("position_accepts", self.position_accepts())?;
        d.set_item("drafter_seconds", self.drafter_seconds())?;
        d.set_item("target_seconds", self.target_seconds())?;
        d.set_item("kernel_seconds", self.kernel_seconds())?;
        d.set_item("total_seconds", self.total_seconds())?;
        d.set_item("prefill_seconds", self.prefill_seconds())?;
        d.set_item("confidence_records", self.confidence_records())?;
        d.set_item("acceptance_length", self.acceptance_length())?;
        d.set_item("per_position_acceptance", self.per_position_acceptance())?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "SpeculationStats(rounds={}, request_rounds={}, committed_tokens={}, \
             drafted_tokens={}, accepted_tokens={}, acceptance_length={:.3}, \
             total_seconds={:.3})",
            self.0.rounds,
            self.0.request_rounds,
            self.0.committed_tokens,
            self.0.drafted_tokens,
            self.0.accepted_tokens,
            self.0.acceptance_length(),
            self.0.total_seconds
        )
    }
}
