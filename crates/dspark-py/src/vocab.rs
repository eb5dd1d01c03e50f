//! `dspark.VocabLayout` and `dspark.IdMap`.

use numpy::PyArray1;
use pyo3::prelude::*;

use dspark::limits::MAX_VOCAB;

use crate::args;
use crate::errors::{err, guard};

/// A vocabulary size argument: a non-negative int up to [`MAX_VOCAB`].
fn vocab(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    args::usize_at_most(obj, name, MAX_VOCAB)
}

/// The vocabulary layout of a drafter/target pair, from the three sizes.
#[pyclass(name = "VocabLayout", module = "dspark", frozen, eq)]
#[derive(PartialEq)]
pub struct PyVocabLayout(dspark::VocabSizes);

#[pymethods]
impl PyVocabLayout {
    /// `VocabLayout(input_vocab, draft_vocab, target_vocab)`.
    #[new]
    fn new(
        input_vocab: &Bound<'_, PyAny>,
        draft_vocab: &Bound<'_, PyAny>,
        target_vocab: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        guard(|| {
            let sizes = dspark::VocabSizes::try_new(
                vocab(input_vocab, "input_vocab")?,
                vocab(draft_vocab, "draft_vocab")?,
                vocab(target_vocab, "target_vocab")?,
            )
            .map_err(err)?;
            Ok(Self(sizes))
        })
    }

    /// `"full"`, `"padded"` or `"reduced"`.
    #[getter]
    fn kind(&self) -> PyResult<&'static str> {
        guard(|| Ok(self.0.layout().as_str()))
    }

    /// `V_in`.
    #[getter]
    fn input_vocab(&self) -> PyResult<usize> {
        guard(|| Ok(self.0.input))
    }

    /// `V_d`.
    #[getter]
    fn draft_vocab(&self) -> PyResult<usize> {
        guard(|| Ok(self.0.draft))
    }

    /// `V_t`.
    #[getter]
    fn target_vocab(&self) -> PyResult<usize> {
        guard(|| Ok(self.0.target))
    }

    /// `V_d < V_t`: needs its own lm_head and a d2t map.
    #[getter]
    fn is_reduced(&self) -> PyResult<bool> {
        guard(|| Ok(self.0.is_reduced()))
    }

    /// `V_in > V_t`: needs its own embed_tokens.
    #[getter]
    fn expanded_input(&self) -> PyResult<bool> {
        guard(|| Ok(self.0.expanded_input()))
    }

    /// Rows `[V_t, V_d)` masked before sampling.
    #[getter]
    fn padded_rows(&self) -> PyResult<usize> {
        guard(|| Ok(self.0.padded_rows()))
    }

    fn __repr__(&self) -> PyResult<String> {
        guard(|| {
            Ok(format!(
                "VocabLayout(kind={:?}, input_vocab={}, draft_vocab={}, target_vocab={})",
                self.0.layout().as_str(),
                self.0.input,
                self.0.draft,
                self.0.target
            ))
        })
    }
}

/// The draft-to-target id map: identity, or a validated `d2t` offset table.
#[pyclass(name = "IdMap", module = "dspark", frozen)]
pub struct PyIdMap(pub dspark::IdMap);

#[pymethods]
impl PyIdMap {
    /// The identity map over `target_vocab` ids (at most [`MAX_VOCAB`]).
    #[staticmethod]
    fn identity(target_vocab: &Bound<'_, PyAny>) -> PyResult<Self> {
        guard(|| {
            let target_vocab = vocab(target_vocab, "target_vocab")?;
            Ok(Self(dspark::IdMap::identity(target_vocab).map_err(err)?))
        })
    }

    /// Validate a `d2t` offset table (`target = draft + d2t[draft]`) against `target_vocab`.
    /// `d2t` is a 1-D integer array/tensor or a list of ints (copied once).
    #[staticmethod]
    fn from_offsets(d2t: &Bound<'_, PyAny>, target_vocab: &Bound<'_, PyAny>) -> PyResult<Self> {
        guard(|| {
            let target_vocab = vocab(target_vocab, "target_vocab")?;
            let offsets = args::ids_1d(d2t, "d2t")?;
            let map =
                dspark::IdMap::from_offsets(&offsets, offsets.len(), target_vocab).map_err(err)?;
            Ok(Self(map))
        })
    }

    /// `"identity"` or `"offset-table"`.
    #[getter]
    fn kind(&self) -> PyResult<&'static str> {
        guard(|| Ok(self.0.kind_str()))
    }

    /// True for the identity map.
    #[getter]
    fn is_identity(&self) -> PyResult<bool> {
        guard(|| Ok(self.0.is_identity()))
    }

    /// `V_t`.
    #[getter]
    fn target_vocab(&self) -> PyResult<usize> {
        guard(|| Ok(self.0.target_vocab()))
    }

    /// The offset table as int64, or `None` for the identity.
    fn offsets<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyArray1<i64>>>> {
        guard(|| Ok(self.0.offsets().map(|o| PyArray1::from_vec(py, o))))
    }

    /// Map draft ids (a 1-D integer array/tensor or a list of ints) to target ids. Raises
    /// `InputError` (`token-out-of-range`) for ids without a target.
    fn to_target<'py>(
        &self,
        py: Python<'py>,
        draft_ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        guard(|| {
            let ids = args::ids_1d(draft_ids, "draft_ids")?;
            let limit = self.0.draft_vocab().unwrap_or(self.0.target_vocab());
            let mut out = Vec::with_capacity(ids.len());
            for &id in &ids {
                let mapped = usize::try_from(id).ok().and_then(|d| self.0.to_target(d));
                match mapped {
                    Some(t) => out.push(i64::from(t)),
                    None => {
                        return Err(err(dspark::Error::TokenOutOfRange {
                            name: "draft_ids".into(),
                            id,
                            vocab_size: limit,
                        }));
                    }
                }
            }
            Ok(PyArray1::from_vec(py, out))
        })
    }

    fn __repr__(&self) -> PyResult<String> {
        guard(|| {
            Ok(format!(
                "IdMap(kind={:?}, target_vocab={})",
                self.0.kind_str(),
                self.0.target_vocab()
            ))
        })
    }
}
