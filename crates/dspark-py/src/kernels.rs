//! Thin bindings of the drafting and verification kernels (`dspark::sampling`).
//!
//! Inputs arrive through DLPack ([`crate::dlpack`]): logits and weights are borrowed in place,
//! never copied, and the GIL is released around the Rust work while the guards keep the memory
//! alive. Outputs are fresh numpy arrays; `python/dspark/kernels.py` turns them into torch
//! tensors (zero-copy) when the main input was a torch tensor, and wraps them in dataclasses.
//!
//! The boundary rule: every body runs inside [`crate::errors::guard`] (a panic is
//! `InternalError`); scalar arguments are read with typed errors by [`crate::args`] before any
//! tensor is exported; output sizes are checked against [`dspark::limits`] before the engine
//! allocates; token ids (small) are copied once, then validated and used, with their real shape.

use numpy::{PyArray1, PyArray2, PyArray3, PyArrayMethods};
use pyo3::prelude::*;

use dspark::policy::StepsPerSecond;
use dspark::sampling::{
    BlockOptions, Mat, PerRequest, Rows3, Seeds, StsCalibration, Tokens, VerifyOptions,
};
use dspark::{Error, limits};

use crate::args;
use crate::dlpack::DlTensor;
use crate::errors::{err, guard};
use crate::kernel_ids::{block_ids, draft_token_ids};

/// The shape of `t`, which must have exactly `N` dimensions.
fn dims<const N: usize>(t: &DlTensor) -> PyResult<[usize; N]> {
    <[usize; N]>::try_from(t.shape()).map_err(|_| {
        err(Error::bad_shape(
            t.name(),
            format!("expected {N} dimensions, got shape {:?}", t.shape()),
        ))
    })
}

fn seeds(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Seeds> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Seeds::Scalar(0));
    };
    Ok(
        match args::per_request(obj, |v| args::uint(v, "seed", u64::MAX))? {
            PerRequest::All(s) => Seeds::Scalar(s),
            PerRequest::Each(v) => Seeds::PerRequest(v),
        },
    )
}

/// One `top_k` value of `verify`: `None` or a negative value = off; beyond u64 is `too-large`.
fn top_k_one(v: &Bound<'_, PyAny>) -> PyResult<Option<usize>> {
    if v.is_none() || args::int_saturating(v, "top_k")? < 0 {
        return Ok(None);
    }
    args::usize_at_most(v, "top_k", u64::MAX).map(Some)
}

/// `top_k`: `None` = off; a per-request list may hold `None` or negative values for "off".
fn top_k(obj: Option<&Bound<'_, PyAny>>) -> PyResult<PerRequest<Option<usize>>> {
    match obj {
        None => Ok(PerRequest::All(None)),
        Some(o) => args::per_request(o, top_k_one),
    }
}

/// A per-request float option (`None`: `default` for every request).
fn floats_per_request(
    obj: Option<&Bound<'_, PyAny>>,
    name: &str,
    default: f32,
) -> PyResult<PerRequest<f32>> {
    match obj {
        Some(o) if !o.is_none() => args::per_request(o, |v| args::float32(v, name)),
        _ => Ok(PerRequest::All(default)),
    }
}

/// `output_elements` for the glue: refuse an output above the documented limit before the
/// engine allocates it, naming the argument the size comes from.
fn output(name: &str, dims: &[usize]) -> PyResult<usize> {
    let dims: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    limits::output_elements(name, &dims).map_err(err)
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

/// Draft one block with the Markov head. See `dspark.sample_block`.
#[pyfunction]
#[pyo3(signature = (base_logits, markov_w1, markov_w2, anchors, *, temperature = None, seed = None,
                    target_vocab_size = None, d2t = None, top_k = None, logit_scale = None))]
#[allow(clippy::too_many_arguments)]
pub fn sample_block<'py>(
    py: Python<'py>,
    base_logits: &Bound<'py, PyAny>,
    markov_w1: &Bound<'py, PyAny>,
    markov_w2: &Bound<'py, PyAny>,
    anchors: &Bound<'py, PyAny>,
    temperature: Option<&Bound<'py, PyAny>>,
    seed: Option<&Bound<'py, PyAny>>,
    target_vocab_size: Option<&Bound<'py, PyAny>>,
    d2t: Option<&Bound<'py, PyAny>>,
    top_k: Option<&Bound<'py, PyAny>>,
    logit_scale: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    guard(|| {
        // Scalars first: nothing is exported or allocated for a call with a bad argument.
        let temperature = args::opt_float32(temperature, "temperature", 0.0)?;
        let logit_scale = args::opt_float32(logit_scale, "logit_scale", 1.0)?;
        let target_vocab_size =
            args::opt_usize(target_vocab_size, "target_vocab_size", limits::MAX_VOCAB)?;
        let top_k = args::opt_usize(top_k, "top_k", u64::MAX)?;
        let seeds = seeds(seed)?;
        #[cfg(feature = "cuda")]
        if let Some(device) = crate::dlpack::cuda::cuda_device_of(base_logits, "base_logits")? {
            let tensors = (base_logits, markov_w1, markov_w2, anchors, d2t);
            let options = (temperature, seeds, target_vocab_size, top_k, logit_scale);
            return crate::kernels_device::sample_block(py, &device, tensors, options);
        }
        let base_t = DlTensor::from_py(base_logits, "base_logits")?;
        let w1_t = DlTensor::from_py(markov_w1, "markov_w1")?;
        let w2_t = DlTensor::from_py(markov_w2, "markov_w2")?;
        let base = Rows3 {
            data: base_t.floats()?,
            dims: dims::<3>(&base_t)?,
        };
        let w1 = Mat {
            data: w1_t.floats()?,
            dims: dims::<2>(&w1_t)?,
        };
        let w2 = Mat {
            data: w2_t.floats()?,
            dims: dims::<2>(&w2_t)?,
        };
        let (anchor_ids, id_map) = block_ids(anchors, d2t, target_vocab_size, base.dims, w1.dims)?;
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
        drop((base_t, w1_t, w2_t));
        let (b, k) = (block.batch, block.slots);
        let tokens = block.tokens.iter().map(|&t| i64::from(t)).collect();
        let arrays = (
            to_numpy2(py, tokens, [b, k])?,
            to_numpy3(py, block.draft_logits, [b, k, block.target_vocab])?,
            to_numpy3(py, block.prev_embeddings, [b, k, block.rank])?,
        );
        Ok(arrays.into_pyobject(py)?.into_any())
    })
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
    num_draft: Option<&Bound<'py, PyAny>>,
    stop_token_ids: Option<&Bound<'py, PyAny>>,
) -> PyResult<VerifyArrays<'py>> {
    guard(|| {
        let temperature = floats_per_request(temperature, "temperature", 0.0)?;
        let top_k = self::top_k(top_k)?;
        let top_p = floats_per_request(top_p, "top_p", 1.0)?;
        let seeds = seeds(seed)?;
        let num_draft = match num_draft.filter(|n| !n.is_none()) {
            Some(n) => Some(
                args::ids_1d(n, "num_draft")?
                    .into_iter()
                    .map(|v| {
                        usize::try_from(v).map_err(|_| {
                            err(Error::invalid("num_draft", format!("{v} (must be >= 0)")))
                        })
                    })
                    .collect::<PyResult<Vec<usize>>>()?,
            ),
            None => None,
        };
        let stops = match stop_token_ids.filter(|s| !s.is_none()) {
            Some(s) => args::ids_1d(s, "stop_token_ids")?,
            None => Vec::new(),
        };
        #[cfg(feature = "cuda")]
        if let Some(device) = crate::dlpack::cuda::cuda_device_of(target_logits, "target_logits")? {
            let options = (temperature, top_k, top_p, seeds, num_draft, stops);
            let out = crate::kernels_device::verify(
                py,
                &device,
                (target_logits, draft_tokens, draft_logits),
                options,
            )?;
            return verify_arrays(py, out);
        }
        let target_t = DlTensor::from_py(target_logits, "target_logits")?;
        let target = Rows3 {
            data: target_t.floats()?,
            dims: dims::<3>(&target_t)?,
        };
        let vocab = target.dims[2];
        let (tokens, token_shape) = draft_token_ids(draft_tokens, target.dims)?;
        let stop_token_ids = args::ids_in_vocab(&stops, "stop_token_ids", vocab)?;
        let q_t = draft_logits
            .filter(|d| !d.is_none())
            .map(|d| DlTensor::from_py(d, "draft_logits"))
            .transpose()?;
        let q = match &q_t {
            Some(t) => Some(Rows3 {
                data: t.floats()?,
                dims: dims::<3>(t)?,
            }),
            None => None,
        };
        let opts = VerifyOptions {
            temperature,
            top_k,
            top_p,
            seeds,
            num_draft,
            stop_token_ids,
        };
        let tokens = Tokens::new(&tokens, token_shape).map_err(err)?;
        let out = py
            .detach(|| dspark::sampling::verify_slices(target, tokens, q, &opts))
            .map_err(err)?;
        drop((target_t, q_t));
        verify_arrays(py, out)
    })
}

fn verify_arrays(
    py: Python<'_>,
    out: dspark::sampling::Verification,
) -> PyResult<VerifyArrays<'_>> {
    let accepted = out.num_accepted.iter().map(|&n| i64::from(n)).collect();
    Ok((
        to_numpy2(py, out.tokens, [out.batch, out.width])?,
        PyArray1::from_vec(py, accepted),
    ))
}

/// Build an STS calibration from a path (JSON) or a list of temperatures.
fn sts(obj: &Bound<'_, PyAny>) -> PyResult<StsCalibration> {
    if args::is_sequence(obj) {
        let mut temps = Vec::new();
        for item in obj.try_iter()? {
            temps.push(args::float32(&item?, "sts")?);
        }
        return StsCalibration::new(temps).map_err(err);
    }
    let path = args::path(obj, "sts")?;
    StsCalibration::from_json_path(&path).map_err(err)
}

/// Confidence per slot: `sigmoid(w · [h ; prev] + b)`, optionally STS-calibrated. See `dspark.confidence`.
#[pyfunction]
#[pyo3(signature = (hidden, prev_embeddings, weight, bias = None, *, sts = None))]
pub fn confidence<'py>(
    py: Python<'py>,
    hidden: &Bound<'py, PyAny>,
    prev_embeddings: Option<&Bound<'py, PyAny>>,
    weight: &Bound<'py, PyAny>,
    bias: Option<&Bound<'py, PyAny>>,
    sts: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    guard(|| {
        let bias = args::opt_float32(bias, "bias", 0.0)?;
        let cal = sts.filter(|s| !s.is_none()).map(self::sts).transpose()?;
        #[cfg(feature = "cuda")]
        if let Some(device) = crate::dlpack::cuda::cuda_device_of(hidden, "hidden")? {
            let tensors = (hidden, prev_embeddings, weight);
            let (out, [b, k]) =
                crate::kernels_device::confidence(py, &device, tensors, bias, cal.as_ref())?;
            return to_numpy2(py, out, [b, k]);
        }
        let hidden_t = DlTensor::from_py(hidden, "hidden")?;
        let weight_t = DlTensor::from_py(weight, "weight")?;
        let prev_t = prev_embeddings
            .filter(|p| !p.is_none())
            .map(|p| DlTensor::from_py(p, "prev_embeddings"))
            .transpose()?;
        let h = Rows3 {
            data: hidden_t.floats()?,
            dims: dims::<3>(&hidden_t)?,
        };
        let [b, k, hidden_size] = h.dims;
        output("hidden", &[b, k])?;
        // The real shapes: a weight `[H (+ r)]` (or `[1, H (+ r)]`; the engine checks the
        // shape, not only the count), prev `[B, K, r]` with the same r.
        let weight_shape = weight_t.shape().to_vec();
        let w_len = weight_t.numel();
        let w = weight_t.floats()?;
        let prev: Option<&[f32]> = match &prev_t {
            Some(t) => {
                let d = dims::<3>(t)?;
                if d[0] != b || d[1] != k || hidden_size.checked_add(d[2]) != Some(w_len) {
                    return Err(err(Error::bad_shape(
                        "prev_embeddings",
                        format!(
                            "shape {:?}, expected [B, K, r] = [{b}, {k}, weight len − H] with \
                             hidden [B, K, H] = {:?} and weight [{w_len}]",
                            t.shape(),
                            h.dims
                        ),
                    )));
                }
                Some(t.slice::<f32>().ok_or_else(|| {
                    err(Error::UnsupportedDtype {
                        name: "prev_embeddings".into(),
                        message: format!(
                            "{} is not supported (expected float32)",
                            t.dtype().name()
                        ),
                    })
                })?)
            }
            None => None,
        };
        let out = py
            .detach(|| {
                dspark::sampling::confidence_slices(h, prev, w, &weight_shape, bias, cal.as_ref())
            })
            .map_err(err)?;
        drop((hidden_t, weight_t, prev_t));
        to_numpy2(py, out, [b, k])
    })
}

/// Read a `[B, K]` float confidence tensor into an owned f32 vector (small: B·K values),
/// refusing sizes above the output limit before copying.
fn conf_matrix(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<(Vec<f32>, usize, usize)> {
    let t = DlTensor::from_py(obj, name)?;
    let [b, k] = dims::<2>(&t)?;
    output(name, &[b, k])?;
    output(name, &[b])?;
    let data = t.floats()?.to_f32_vec();
    Ok((data, b, k))
}

/// Static threshold: each request's verify length is its slots before the first `c < threshold`.
#[pyfunction]
pub fn schedule_threshold(
    confidence: &Bound<'_, PyAny>,
    threshold: &Bound<'_, PyAny>,
) -> PyResult<Vec<usize>> {
    guard(|| {
        let threshold = args::float32(threshold, "threshold")?;
        if threshold.is_nan() {
            return Err(err(Error::NonFinite {
                name: "threshold".into(),
                message: "NaN".into(),
            }));
        }
        let (c, b, k) = conf_matrix(confidence, "confidence")?;
        dspark::policy::threshold_lengths(&c, b, k, threshold).map_err(err)
    })
}

/// A steps-per-second table (a list of `(tokens, steps/s)` pairs) with its interpolation:
/// `"step"` (value at the smallest profiled size `>= n`) or `"linear"`.
pub(crate) fn sps_table(
    table: &Bound<'_, PyAny>,
    interpolation: Option<&Bound<'_, PyAny>>,
) -> PyResult<StepsPerSecond> {
    let name = "steps_per_second";
    let bad = || {
        err(Error::invalid(
            name,
            "expected a list of (tokens, steps per second) pairs",
        ))
    };
    if !args::is_sequence(table) {
        return Err(bad());
    }
    let mut points = Vec::new();
    for pair in table.try_iter()? {
        let pair = pair?;
        if !args::is_sequence(&pair) || pair.len()? != 2 {
            return Err(bad());
        }
        let n = args::usize_at_most(&pair.get_item(0)?, name, u64::MAX)?;
        let sps = args::float(&pair.get_item(1)?, name)?;
        points.push((n, sps));
    }
    let interpolation = match interpolation.filter(|i| !i.is_none()) {
        Some(i) => args::string(i, "interpolation")?,
        None => "step".to_string(),
    };
    match interpolation.as_str() {
        "step" => StepsPerSecond::step(points),
        "linear" => StepsPerSecond::linear(points),
        other => Err(Error::invalid(
            "interpolation",
            format!("{other:?} (expected \"step\" or \"linear\")"),
        )),
    }
    .map_err(err)
}

/// The paper's scheduler (admit by survival while expected tokens × SPS strictly improves);
/// with `ahead` (`[B, K]`, acceptance predicted without this round's draws), the look-ahead
/// variant that can cross a cliff in the table; with `batch_wide`, the batch-wide look-ahead
/// the engine runs (`ahead` absent: predicted 0).
#[pyfunction]
#[pyo3(signature = (
    confidence, steps_per_second, interpolation = None, *, ahead = None, batch_wide = false
))]
pub fn schedule_lengths(
    confidence: &Bound<'_, PyAny>,
    steps_per_second: &Bound<'_, PyAny>,
    interpolation: Option<&Bound<'_, PyAny>>,
    ahead: Option<&Bound<'_, PyAny>>,
    batch_wide: bool,
) -> PyResult<Vec<usize>> {
    guard(|| {
        let sps = sps_table(steps_per_second, interpolation)?;
        let (c, b, k) = conf_matrix(confidence, "confidence")?;
        let a = match ahead.filter(|a| !a.is_none()) {
            Some(ahead) => {
                let (a, b2, k2) = conf_matrix(ahead, "ahead")?;
                if (b, k) != (b2, k2) {
                    return Err(err(Error::bad_shape(
                        "ahead",
                        format!("shape [{b2}, {k2}] differs from confidence [{b}, {k}]"),
                    )));
                }
                Some(a)
            }
            None => None,
        };
        match (a, batch_wide) {
            (a, true) => {
                let a = a.unwrap_or_else(|| vec![0.0; c.len()]);
                dspark::policy::schedule_lengths_batch(&c, b, k, &sps, &a)
            }
            (Some(a), false) => dspark::policy::schedule_lengths_ahead(&c, b, k, &sps, &a),
            (None, false) => dspark::policy::schedule_lengths(&c, b, k, &sps),
        }
        .map_err(err)
    })
}

/// Pipelined scheduler: capacity from the stale confidences, then the top slots by current survival.
#[pyfunction]
#[pyo3(signature = (stale, current, steps_per_second, interpolation = None))]
pub fn schedule_pipelined(
    stale: &Bound<'_, PyAny>,
    current: &Bound<'_, PyAny>,
    steps_per_second: &Bound<'_, PyAny>,
    interpolation: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<usize>> {
    guard(|| {
        let sps = sps_table(steps_per_second, interpolation)?;
        let (s, b, k) = conf_matrix(stale, "stale")?;
        let (c, b2, k2) = conf_matrix(current, "current")?;
        if (b, k) != (b2, k2) {
            return Err(err(Error::bad_shape(
                "current",
                format!("shape [{b2}, {k2}] differs from stale [{b}, {k}]"),
            )));
        }
        dspark::policy::schedule_pipelined(&s, &c, b, k, &sps).map_err(err)
    })
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
