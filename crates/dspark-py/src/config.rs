//! `dspark.DraftSpec`.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{err, guard};
use crate::{args, json};

/// A drafter config normalized from any accepted shape (DeepSpec, speculators, dflash_config,
/// DeepSeek-V4).
#[pyclass(name = "DraftSpec", module = "dspark", frozen)]
pub struct PyDraftSpec(pub dspark::DraftSpec);

#[pymethods]
impl PyDraftSpec {
    /// Read a draft config from a directory, a `config.json` path, or a dict.
    #[staticmethod]
    fn from_pretrained(path_or_dict: &Bound<'_, PyAny>) -> PyResult<Self> {
        guard(|| {
            let py = path_or_dict.py();
            let spec = if let Ok(dict) = path_or_dict.cast::<PyDict>() {
                let value = json::from_py_dict(dict)?;
                py.detach(|| dspark::DraftSpec::from_value(&value, "<dict>"))
            } else {
                let path: PathBuf = args::path(path_or_dict, "path_or_dict")?;
                py.detach(|| dspark::DraftSpec::from_path(&path))
            };
            Ok(Self(spec.map_err(err)?))
        })
    }

    /// `"deepspec"`, `"speculators"`, `"dflash"` or `"deepseek-v4"`.
    #[getter]
    fn format(&self) -> PyResult<&'static str> {
        guard(|| Ok(self.0.format.as_str()))
    }

    /// `architectures[0]`.
    #[getter]
    fn architecture(&self) -> PyResult<&str> {
        guard(|| Ok(self.0.architecture.as_str()))
    }

    /// Draft tokens per round.
    #[getter]
    fn block_size(&self) -> PyResult<usize> {
        guard(|| Ok(self.0.block_size))
    }

    /// Slot k predicts position n+k+1 (DeepSpec layout) when true; 1+K layout when false.
    #[getter]
    fn sample_from_anchor(&self) -> PyResult<bool> {
        guard(|| Ok(self.0.sample_from_anchor))
    }

    /// The noise (mask) token id.
    #[getter]
    fn noise_token_id(&self) -> PyResult<u32> {
        guard(|| Ok(self.0.noise_token.id))
    }

    /// The config key that supplied the noise token.
    #[getter]
    fn noise_token_source(&self) -> PyResult<&'static str> {
        guard(|| Ok(self.0.noise_token.source.key()))
    }

    /// Target layer ids, DeepSpec semantics (output of layer i).
    #[getter]
    fn target_layer_ids(&self) -> PyResult<Vec<i64>> {
        guard(|| Ok(self.0.target_layer_ids.clone()))
    }

    /// Target layer ids, capture semantics (input of layer i+1 = HF `hidden_states[i+1]`).
    #[getter]
    fn capture_layer_ids(&self) -> PyResult<Vec<usize>> {
        guard(|| Ok(self.0.capture_layer_ids.clone()))
    }

    /// Markov head rank (0 = DFlash).
    #[getter]
    fn markov_rank(&self) -> PyResult<usize> {
        guard(|| Ok(self.0.markov_rank))
    }

    /// Whether the config enables the confidence head.
    #[getter]
    fn confidence_head(&self) -> PyResult<bool> {
        guard(|| Ok(self.0.confidence_head))
    }

    /// `V_in`.
    #[getter]
    fn vocab_size(&self) -> PyResult<usize> {
        guard(|| Ok(self.0.shape.vocab_size))
    }

    /// `V_d`.
    #[getter]
    fn draft_vocab_size(&self) -> PyResult<usize> {
        guard(|| Ok(self.0.draft_vocab_size))
    }

    /// Draft hidden size.
    #[getter]
    fn hidden_size(&self) -> PyResult<usize> {
        guard(|| Ok(self.0.shape.hidden_size))
    }

    /// Every normalized field as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        guard(|| {
            let value = serde_json::to_value(&self.0).map_err(|e| {
                err(dspark::Error::Internal {
                    message: format!("DraftSpec did not serialize: {e}"),
                })
            })?;
            json::to_py(py, &value)
        })
    }

    fn __repr__(&self) -> PyResult<String> {
        guard(|| {
            Ok(format!(
                "DraftSpec(format={:?}, architecture={:?}, block_size={}, markov_rank={}, vocab_size={}, draft_vocab_size={})",
                self.0.format.as_str(),
                self.0.architecture,
                self.0.block_size,
                self.0.markov_rank,
                self.0.shape.vocab_size,
                self.0.draft_vocab_size
            ))
        })
    }
}
