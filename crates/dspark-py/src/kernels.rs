//! Thin bindings of the drafting and verification kernels (`dspark::sampling`).
//!
//! Inputs arrive through DLPack ([`crate::dlpack`]): logits and weights are borrowed in place,
//! never copied, and the GIL is released around the Rust work while the guards keep the memory
//! alive. Outputs are fresh numpy arrays; `python/dspark/kernels.py` turns them into torch
//! tensors (zero-copy) when the main input was a torch tensor, and wraps them in dataclasses.

use std::borrow::Cow;

use numpy::{PyArray1, PyArray2, PyArray3, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use dspark::Error;
use dspark::sampling::{
    BlockOptions, Floats, Mat, PerRequest, Rows3, Seeds, StepsPerSecond, StsCalibration,
    VerifyOptions,
};

use crate::dlpack::DlTensor;
use crate::errors::PyDSparkError;

fn err(e: Error) -> PyErr {
    PyDSparkError(e).into()
}

/// View a float tensor (f32/f16/bf16) as engine [`Floats`].
fn floats(t: &DlTensor) -> PyResult<Floats<'_>> {
    if let Some(s) = t.slice::<f32>() {
        return Ok(Floats::F32(s));
    }
    if let Some(s) = t.slice::<half::f16>() {
        return Ok(Floats::F16(s));
    }
    if let Some(s) = t.slice::<half::bf16>() {
        return Ok(Floats::BF16(s));
    }
    Err(err(Error::UnsupportedDtype {
        name: t.name().to_string(),
        message: format!(
            "{} is not supported (expected float32, float16 or bfloat16)",
            t.dtype().name()
        ),
    }))
}

/// The shape of `t`, which must have exactly `N` dimensions.
fn dims<const N: usize>(t: &DlTensor) -> PyResult<[usize; N]> {
    <[usize; N]>::try_from(t.shape()).map_err(|_| {
        err(Error::bad_shape(
            t.name(),
            format!("expected {N} dimensions, got shape {:?}", t.shape()),
        ))
    })
}

fn not_ids(t: &DlTensor) -> PyErr {
    err(Error::UnsupportedDtype {
        name: t.name().to_string(),
        message: format!(
            "{} is not supported for token ids (expected int32, int64 or uint32)",
            t.dtype().name()
        ),
    })
}

/// Token ids as `i64` (borrowed when already int64).
fn ids_i64(t: &DlTensor) -> PyResult<Cow<'_, [i64]>> {
    if let Some(s) = t.slice::<i64>() {
        return Ok(Cow::Borrowed(s));
    }
    if let Some(s) = t.slice::<i32>() {
        return Ok(Cow::Owned(s.iter().map(|&x| i64::from(x)).collect()));
    }
    if let Some(s) = t.slice::<u32>() {
        return Ok(Cow::Owned(s.iter().map(|&x| i64::from(x)).collect()));
    }
    Err(not_ids(t))
}

/// Token ids as `u32` (borrowed when already uint32); negative or huge ids are
/// `token-out-of-range` against `vocab`.
fn ids_u32(t: &DlTensor, vocab: usize) -> PyResult<Cow<'_, [u32]>> {
    if let Some(s) = t.slice::<u32>() {
        return Ok(Cow::Borrowed(s));
    }
    let wide = ids_i64(t)?;
    wide.iter()
        .map(|&x| {
            u32::try_from(x).map_err(|_| {
                err(Error::TokenOutOfRange {
                    name: t.name().to_string(),
                    id: x,
                    vocab_size: vocab,
                })
            })
        })
        .collect::<PyResult<Vec<u32>>>()
        .map(Cow::Owned)
}

/// A scalar or a per-request sequence (list/tuple; the Python front converts arrays).
fn scalar_or_list<'py, T>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<PerRequest<T>>
where
    T: for<'a> FromPyObject<'a, 'py>,
{
    let bad = |what: &str| err(Error::invalid(name, what.to_string()));
    if obj.cast::<PyList>().is_ok() || obj.cast::<PyTuple>().is_ok() {
        let mut out = Vec::new();
        for item in obj.try_iter()? {
            out.push(
                item?
                    .extract::<T>()
                    .map_err(|_| bad("bad per-request value"))?,
            );
        }
        Ok(PerRequest::Each(out))
    } else {
        Ok(PerRequest::All(obj.extract::<T>().map_err(|_| {
            bad("expected a number or one number per request")
        })?))
    }
}

fn seeds(obj: &Bound<'_, PyAny>) -> PyResult<Seeds> {
    let bad = || {
        err(Error::invalid(
            "seed",
            "expected a non-negative integer below 2**64, or one per request",
        ))
    };
    match scalar_or_list::<u64>(obj, "seed").map_err(|_| bad())? {
        PerRequest::All(s) => Ok(Seeds::Scalar(s)),
        PerRequest::Each(v) => Ok(Seeds::PerRequest(v)),
    }
}

/// `top_k`: `None` = off; a per-request list may hold `None` or negative values for "off".
fn top_k(obj: Option<&Bound<'_, PyAny>>) -> PyResult<PerRequest<Option<usize>>> {
    let Some(obj) = obj else {
        return Ok(PerRequest::All(None));
    };
    let one = |v: Option<i64>| -> PyResult<Option<usize>> {
        match v {
            None => Ok(None),
            Some(k) if k < 0 => Ok(None),
            Some(k) => usize::try_from(k)
                .map(Some)
                .map_err(|_| err(Error::invalid("top_k", "out of range"))),
        }
    };
    Ok(match scalar_or_list::<Option<i64>>(obj, "top_k")? {
        PerRequest::All(v) => PerRequest::All(one(v)?),
        PerRequest::Each(vs) => PerRequest::Each(vs.into_iter().map(one).collect::<PyResult<_>>()?),
    })
}

fn to_numpy2<'py, T: numpy::Element>(
    py: Python<'py>,
    v: Vec<T>,
    shape: [usize; 2],
) -> PyResult<Bound<'py, PyArray2<T>>> {
    PyArray1::from_vec(py, v).reshape(shape)
}

fn to_numpy3<'py, T: numpy::Element>(
    py: Python<'py>,
    v: Vec<T>,
    shape: [usize; 3],
) -> PyResult<Bound<'py, PyArray3<T>>> {
    PyArray1::from_vec(py, v).reshape(shape)
}

/// Arrays of a drafted block: `(tokens [B,K] int64, draft_logits [B,K,V_t] f32, prev_embeddings [B,K,r] f32)`.
type BlockArrays<'py> = (
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray3<f32>>,
    Bound<'py, PyArray3<f32>>,
);

/// Draft one block with the Markov head. See `dspark.sample_block`.
#[pyfunction]
#[pyo3(signature = (base_logits, markov_w1, markov_w2, anchors, *, temperature = 0.0, seed = None,
                    target_vocab_size = None, d2t = None, top_k = None, logit_scale = 1.0))]
#[allow(clippy::too_many_arguments)]
pub fn sample_block<'py>(
    py: Python<'py>,
    base_logits: &Bound<'py, PyAny>,
    markov_w1: &Bound<'py, PyAny>,
    markov_w2: &Bound<'py, PyAny>,
    anchors: &Bound<'py, PyAny>,
    temperature: f32,
    seed: Option<&Bound<'py, PyAny>>,
    target_vocab_size: Option<usize>,
    d2t: Option<&Bound<'py, PyAny>>,
    top_k: Option<usize>,
    logit_scale: f32,
) -> PyResult<BlockArrays<'py>> {
    let base_t = DlTensor::from_py(base_logits, "base_logits")?;
    let w1_t = DlTensor::from_py(markov_w1, "markov_w1")?;
    let w2_t = DlTensor::from_py(markov_w2, "markov_w2")?;
    let anchors_t = DlTensor::from_py(anchors, "anchors")?;
    let base = Rows3 {
        data: floats(&base_t)?,
        dims: dims::<3>(&base_t)?,
    };
    let w1 = Mat {
        data: floats(&w1_t)?,
        dims: dims::<2>(&w1_t)?,
    };
    let w2 = Mat {
        data: floats(&w2_t)?,
        dims: dims::<2>(&w2_t)?,
    };
    dims::<1>(&anchors_t)?;
    let anchor_ids = ids_u32(&anchors_t, w1.dims[0])?;
    let draft_vocab = base.dims[2];
    let id_map = match (d2t, target_vocab_size) {
        (Some(d2t), tv) => {
            let d2t_t = DlTensor::from_py(d2t, "d2t")?;
            dims::<1>(&d2t_t)?;
            let offsets = ids_i64(&d2t_t)?;
            let Some(tv) = tv else {
                return Err(err(Error::invalid(
                    "target_vocab_size",
                    "required when d2t is given",
                )));
            };
            dspark::IdMap::from_offsets(&offsets, draft_vocab, tv).map_err(err)?
        }
        (None, Some(tv)) if tv > draft_vocab => {
            return Err(err(Error::MissingD2t {
                draft: draft_vocab,
                target: tv,
            }));
        }
        (None, tv) => dspark::IdMap::identity(tv.unwrap_or(draft_vocab)),
    };
    let seeds = match seed {
        Some(s) => seeds(s)?,
        None => Seeds::Scalar(0),
    };
    let opts = BlockOptions {
        temperature,
        seeds,
        id_map: &id_map,
        top_k,
        logit_scale,
    };
    let anchor_ids: &[u32] = &anchor_ids;
    let block = py
        .detach(|| dspark::sampling::sample_block_slices(base, w1, w2, anchor_ids, &opts))
        .map_err(err)?;
    drop((base_t, w1_t, w2_t, anchors_t));
    let (b, k) = (block.batch, block.slots);
    let tokens = block.tokens.iter().map(|&t| i64::from(t)).collect();
    Ok((
        to_numpy2(py, tokens, [b, k])?,
        to_numpy3(py, block.draft_logits, [b, k, block.target_vocab])?,
        to_numpy3(py, block.prev_embeddings, [b, k, block.rank])?,
    ))
}

/// Arrays of a verification: `(tokens [B,K+1] int64, num_accepted [B] int64)`.
type VerifyArrays<'py> = (Bound<'py, PyArray2<i64>>, Bound<'py, PyArray1<i64>>);

/// Verify a drafted block against the target logits. See `dspark.verify`.
#[pyfunction]
#[pyo3(signature = (target_logits, draft_tokens, draft_logits = None, *, temperature = None,
                    top_k = None, top_p = None, seed = None, num_draft = None,
                    stop_token_ids = None))]
#[allow(clippy::too_many_arguments)]
pub fn verify<'py>(
    py: Python<'py>,
    target_logits: &Bound<'py, PyAny>,
    draft_tokens: &Bound<'py, PyAny>,
    draft_logits: Option<&Bound<'py, PyAny>>,
    temperature: Option<&Bound<'py, PyAny>>,
    top_k: Option<&Bound<'py, PyAny>>,
    top_p: Option<&Bound<'py, PyAny>>,
    seed: Option<&Bound<'py, PyAny>>,
    num_draft: Option<Vec<usize>>,
    stop_token_ids: Option<Vec<u32>>,
) -> PyResult<VerifyArrays<'py>> {
    let target_t = DlTensor::from_py(target_logits, "target_logits")?;
    let tokens_t = DlTensor::from_py(draft_tokens, "draft_tokens")?;
    let q_t = draft_logits
        .map(|d| DlTensor::from_py(d, "draft_logits"))
        .transpose()?;
    let target = Rows3 {
        data: floats(&target_t)?,
        dims: dims::<3>(&target_t)?,
    };
    dims::<2>(&tokens_t)?;
    let tokens = ids_i64(&tokens_t)?;
    let q = match &q_t {
        Some(t) => Some(Rows3 {
            data: floats(t)?,
            dims: dims::<3>(t)?,
        }),
        None => None,
    };
    let opts = VerifyOptions {
        temperature: match temperature {
            Some(t) => scalar_or_list::<f32>(t, "temperature")?,
            None => PerRequest::All(0.0),
        },
        top_k: self::top_k(top_k)?,
        top_p: match top_p {
            Some(p) if !p.is_none() => scalar_or_list::<f32>(p, "top_p")?,
            _ => PerRequest::All(1.0),
        },
        seeds: match seed {
            Some(s) => seeds(s)?,
            None => Seeds::Scalar(0),
        },
        num_draft,
        stop_token_ids: stop_token_ids.unwrap_or_default(),
    };
    let tokens: &[i64] = &tokens;
    let out = py
        .detach(|| dspark::sampling::verify_slices(target, tokens, q, &opts))
        .map_err(err)?;
    drop((target_t, tokens_t, q_t));
    let accepted = out.num_accepted.iter().map(|&n| i64::from(n)).collect();
    Ok((
        to_numpy2(py, out.tokens, [out.batch, out.width])?,
        PyArray1::from_vec(py, accepted),
    ))
}

/// Build an STS calibration from a path (JSON) or a list of temperatures.
fn sts(obj: &Bound<'_, PyAny>) -> PyResult<StsCalibration> {
    if let Ok(temps) = obj.extract::<Vec<f32>>() {
        return StsCalibration::new(temps).map_err(err);
    }
    let path: std::path::PathBuf = obj.extract().map_err(|_| {
        err(Error::invalid(
            "sts",
            "expected a path to a JSON file or a list of temperatures",
        ))
    })?;
    StsCalibration::from_json_path(&path).map_err(err)
}

/// Confidence per slot: `sigmoid(w · [h ; prev] + b)`, optionally STS-calibrated. See `dspark.confidence`.
#[pyfunction]
#[pyo3(signature = (hidden, prev_embeddings, weight, bias = 0.0, *, sts = None))]
pub fn confidence<'py>(
    py: Python<'py>,
    hidden: &Bound<'py, PyAny>,
    prev_embeddings: Option<&Bound<'py, PyAny>>,
    weight: &Bound<'py, PyAny>,
    bias: f32,
    sts: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let hidden_t = DlTensor::from_py(hidden, "hidden")?;
    let weight_t = DlTensor::from_py(weight, "weight")?;
    let prev_t = prev_embeddings
        .map(|p| DlTensor::from_py(p, "prev_embeddings"))
        .transpose()?;
    let h = Rows3 {
        data: floats(&hidden_t)?,
        dims: dims::<3>(&hidden_t)?,
    };
    let w = floats(&weight_t)?;
    let prev: Option<&[f32]> = match &prev_t {
        Some(t) => {
            let d = dims::<3>(t)?;
            if d[0] != h.dims[0] || d[1] != h.dims[1] {
                return Err(err(Error::bad_shape(
                    "prev_embeddings",
                    format!(
                        "shape {:?} does not match hidden's [B, K] = {:?}",
                        t.shape(),
                        &h.dims[..2]
                    ),
                )));
            }
            Some(t.slice::<f32>().ok_or_else(|| {
                err(Error::UnsupportedDtype {
                    name: "prev_embeddings".into(),
                    message: format!("{} is not supported (expected float32)", t.dtype().name()),
                })
            })?)
        }
        None => None,
    };
    let cal = sts.filter(|s| !s.is_none()).map(self::sts).transpose()?;
    let out = py
        .detach(|| dspark::sampling::confidence_slices(h, prev, w, bias, cal.as_ref()))
        .map_err(err)?;
    let [b, k, _] = h.dims;
    drop((hidden_t, weight_t, prev_t));
    to_numpy2(py, out, [b, k])
}

/// Read a `[B, K]` float32 confidence tensor into an owned vector (small: B·K values).
fn conf_matrix(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<(Vec<f32>, usize, usize)> {
    let t = DlTensor::from_py(obj, name)?;
    let [b, k] = dims::<2>(&t)?;
    let data = match floats(&t)? {
        Floats::F32(s) => s.to_vec(),
        Floats::F16(s) => s.iter().map(|x| x.to_f32()).collect(),
        Floats::BF16(s) => s.iter().map(|x| x.to_f32()).collect(),
    };
    Ok((data, b, k))
}

/// Static threshold: each request's verify length is its slots before the first `c < threshold`.
#[pyfunction]
pub fn schedule_threshold(confidence: &Bound<'_, PyAny>, threshold: f32) -> PyResult<Vec<usize>> {
    let (c, b, k) = conf_matrix(confidence, "confidence")?;
    Ok(dspark::sampling::threshold_lengths(&c, b, k, threshold))
}

/// A steps-per-second table: `"step"` (value at the smallest profiled size `>= n`) or `"linear"`.
fn sps_table(table: Vec<(usize, f64)>, interpolation: &str) -> PyResult<StepsPerSecond> {
    match interpolation {
        "step" => StepsPerSecond::step(table),
        "linear" => StepsPerSecond::linear(table),
        other => Err(Error::invalid(
            "interpolation",
            format!("{other:?} (expected \"step\" or \"linear\")"),
        )),
    }
    .map_err(err)
}

/// The paper's scheduler (admit by survival while expected tokens × SPS strictly improves).
#[pyfunction]
#[pyo3(signature = (confidence, steps_per_second, interpolation = "step"))]
pub fn schedule_lengths(
    confidence: &Bound<'_, PyAny>,
    steps_per_second: Vec<(usize, f64)>,
    interpolation: &str,
) -> PyResult<Vec<usize>> {
    let (c, b, k) = conf_matrix(confidence, "confidence")?;
    let sps = sps_table(steps_per_second, interpolation)?;
    Ok(dspark::sampling::schedule_lengths(&c, b, k, &sps))
}

/// Pipelined scheduler: capacity from the stale confidences, then the top slots by current survival.
#[pyfunction]
#[pyo3(signature = (stale, current, steps_per_second, interpolation = "step"))]
pub fn schedule_pipelined(
    stale: &Bound<'_, PyAny>,
    current: &Bound<'_, PyAny>,
    steps_per_second: Vec<(usize, f64)>,
    interpolation: &str,
) -> PyResult<Vec<usize>> {
    let (s, b, k) = conf_matrix(stale, "stale")?;
    let (c, b2, k2) = conf_matrix(current, "current")?;
    if (b, k) != (b2, k2) {
        return Err(err(Error::bad_shape(
            "current",
            format!("shape [{b2}, {k2}] differs from stale [{b}, {k}]"),
        )));
    }
    let sps = sps_table(steps_per_second, interpolation)?;
    Ok(dspark::sampling::schedule_pipelined(&s, &c, b, k, &sps))
}

/// Register the kernel functions on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sample_block, m)?)?;
    m.add_function(wrap_pyfunction!(verify, m)?)?;
    m.add_function(wrap_pyfunction!(confidence, m)?)?;
    m.add_function(wrap_pyfunction!(schedule_threshold, m)?)?;
    m.add_function(wrap_pyfunction!(schedule_lengths, m)?)?;
    m.add_function(wrap_pyfunction!(schedule_pipelined, m)?)?;
    Ok(())
}
