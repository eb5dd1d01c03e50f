//! `dspark.VocabLayout` and `dspark.IdMap`.

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use crate::errors::PyDSparkError;

/// The vocabulary layout of a drafter/target pair, from the three sizes.
#[pyclass(name = "VocabLayout", module = "dspark", frozen, eq)]
#[derive(PartialEq)]
pub struct PyVocabLayout(dspark::VocabSizes);

#[pymethods]
impl PyVocabLayout {
    /// `VocabLayout(input_vocab, draft_vocab, target_vocab)`.
    #[new]
    fn new(input_vocab: usize, draft_vocab: usize, target_vocab: usize) -> Self {
        Self(dspark::VocabSizes::new(
            input_vocab,
            draft_vocab,
            target_vocab,
        ))
    }

    /// `"full"`, `"padded"` or `"reduced"`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.0.layout().as_str()
    }

    /// `V_in`.
    #[getter]
    fn input_vocab(&self) -> usize {
        self.0.input
    }

    /// `V_d`.
    #[getter]
    fn draft_vocab(&self) -> usize {
        self.0.draft
    }

    /// `V_t`.
    #[getter]
    fn target_vocab(&self) -> usize {
        self.0.target
    }

    /// `V_d < V_t`: needs its own lm_head and a d2t map.
    #[getter]
    fn is_reduced(&self) -> bool {
        self.0.is_reduced()
    }

    /// `V_in > V_t`: needs its own embed_tokens.
    #[getter]
    fn expanded_input(&self) -> bool {
        self.0.expanded_input()
    }

    /// Rows `[V_t, V_d)` masked before sampling.
    #[getter]
    fn padded_rows(&self) -> usize {
        self.0.padded_rows()
    }

    fn __repr__(&self) -> String {
        format!(
            "VocabLayout(kind={:?}, input_vocab={}, draft_vocab={}, target_vocab={})",
            self.kind(),
            self.0.input,
            self.0.draft,
            self.0.target
        )
    }
}

/// The draft-to-target id map: identity, or a validated `d2t` offset table.
#[pyclass(name = "IdMap", module = "dspark", frozen)]
pub struct PyIdMap(pub dspark::IdMap);

#[pymethods]
impl PyIdMap {
    /// The identity map over `target_vocab` ids.
    #[staticmethod]
    fn identity(target_vocab: usize) -> Self {
        Self(dspark::IdMap::identity(target_vocab))
    }

    /// Validate a `d2t` offset table (`target = draft + d2t[draft]`) against `target_vocab`.
    #[staticmethod]
    fn from_offsets(d2t: PyReadonlyArray1<'_, i64>, target_vocab: usize) -> PyResult<Self> {
        let offsets = d2t
            .as_slice()
            .map_err(|e| crate::errors::value_error(e.to_string()))?;
        let map = dspark::IdMap::from_offsets(offsets, offsets.len(), target_vocab)
            .map_err(PyDSparkError)?;
        Ok(Self(map))
    }

    /// `"identity"` or `"offset-table"`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.0.kind_str()
    }

    /// True for the identity map.
    #[getter]
    fn is_identity(&self) -> bool {
        self.0.is_identity()
    }

    /// `V_t`.
    #[getter]
    fn target_vocab(&self) -> usize {
        self.0.target_vocab()
    }

    /// The offset table as int64, or `None` for the identity.
    fn offsets<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyArray1<i64>>> {
        self.0.offsets().map(|o| PyArray1::from_vec(py, o))
    }

    /// Map draft ids to target ids. Raises `VocabError` for ids without a target.
    fn to_target<'py>(
        &self,
        py: Python<'py>,
        draft_ids: PyReadonlyArray1<'_, i64>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let ids = draft_ids
            .as_slice()
            .map_err(|e| crate::errors::value_error(e.to_string()))?;
        let limit = self.0.draft_vocab().unwrap_or(self.0.target_vocab());
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            let mapped = usize::try_from(id).ok().and_then(|d| self.0.to_target(d));
            match mapped {
                Some(t) => out.push(i64::from(t)),
                None => {
                    return Err(PyDSparkError(dspark::Error::TokenOutOfRange {
                        name: "draft_ids".into(),
                        id,
                        vocab_size: limit,
                    })
                    .into());
                }
            }
        }
        Ok(PyArray1::from_vec(py, out))
    }

    fn __repr__(&self) -> String {
        format!(
            "IdMap(kind={:?}, target_vocab={})",
            self.kind(),
            self.0.target_vocab()
        )
    }
}
