//! The drafter bindings' argument conversions: DLPack inputs to candle tensors and ids, the
//! per-call options, proposals back to numpy, and what loading needs (the target's spec,
//! weight sharing, the STS table).

use candle_core::{Device, Tensor};
use numpy::{PyArray1, PyArray2, PyArray3, PyArrayMethods};
use pyo3::prelude::*;

use dspark::checkpoint::{Inventory, LoadPlan};
use dspark::sampling::{PerRequest, Seeds, StsCalibration};
use dspark::{
    DraftSpec, Drafter, Error, LoadOptions, Proposal, ProposeOptions, Qwen3Drafter, SharedWeights,
    TargetSpec, WeightSource, limits,
};

use crate::args;
use crate::dlpack::DlTensor;
use crate::errors::err;

/// Copy a float DLPack tensor into an `f32` candle tensor on the CPU.
pub(crate) fn tensor_f32(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Tensor> {
    let t = DlTensor::from_py(obj, name)?;
    let shape = t.shape().to_vec();
    let values = t.floats()?.to_f32_vec();
    Tensor::from_vec(values, shape, &Device::Cpu).map_err(|e| err(e.into()))
}

/// Token ids (a DLPack tensor of at most one dimension, or a list of ints), copied once and
/// checked against `vocab` (`token-out-of-range`).
pub(crate) fn ids_u32(obj: &Bound<'_, PyAny>, name: &str, vocab: usize) -> PyResult<Vec<u32>> {
    let (values, shape) = args::ids(obj, name)?;
    if shape.len() > 1 {
        return Err(err(Error::bad_shape(
            name,
            format!("expected one id per request, got shape {shape:?}"),
        )));
    }
    args::ids_in_vocab(&values, name, vocab)
}

/// An int or a list/tuple of ints, each a non-negative integer.
pub(crate) fn one_or_many(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<u64>> {
    Ok(
        match args::per_request(obj, |v| args::uint(v, name, u64::MAX))? {
            PerRequest::All(v) => vec![v],
            PerRequest::Each(v) => v,
        },
    )
}

pub(crate) fn options(
    temperature: Option<&Bound<'_, PyAny>>,
    seed: Option<&Bound<'_, PyAny>>,
    top_k: Option<&Bound<'_, PyAny>>,
) -> PyResult<ProposeOptions> {
    let temperature = args::opt_float32(temperature, "temperature", 0.0)?;
    let top_k = args::opt_usize(top_k, "top_k", u64::MAX)?;
    let seeds = match seed.filter(|s| !s.is_none()) {
        None => Seeds::Scalar(0),
        Some(s) if args::is_sequence(s) => Seeds::PerRequest(one_or_many(s, "seed")?),
        Some(s) => Seeds::Scalar(args::uint(s, "seed", u64::MAX)?),
    };
    Ok(ProposeOptions {
        logit_bias: None,
        in_block: None,
        guides: None,
        temperature,
        seeds,
        top_k,
    })
}

/// Refuse a proposal whose outputs (`[B, K, V_t]` logits) would exceed the output limit, before
/// the engine allocates them.
pub(crate) fn check_output(inner: &Qwen3Drafter, batch: usize) -> PyResult<()> {
    let dims = [
        batch as u64,
        inner.info().num_draft_tokens as u64,
        inner.info().vocab.target as u64,
    ];
    limits::output_elements("anchors", &dims).map_err(err)?;
    Ok(())
}

/// `(tokens [B,K] int64, draft_logits [B,K,V_t] float32, confidence [B,K] float32 | None)`.
pub(crate) type ProposalArrays<'py> = (
    Bound<'py, PyArray2<i64>>,
    Bound<'py, PyArray3<f32>>,
    Option<Bound<'py, PyArray2<f32>>>,
);

pub(crate) fn arrays(py: Python<'_>, p: Proposal) -> PyResult<ProposalArrays<'_>> {
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
pub(crate) fn plan_sharing(
    path: &std::path::Path,
    target: &TargetSpec,
) -> Result<(bool, bool), Error> {
    let spec = DraftSpec::from_path(path)?;
    let inventory = Inventory::open(path)?;
    let plan = LoadPlan::build(&spec, target, &inventory)?;
    Ok((
        plan.embed_tokens == WeightSource::SharedTarget,
        plan.lm_head == WeightSource::SharedTarget,
    ))
}

pub(crate) fn target_spec(target_config: &str) -> PyResult<TargetSpec> {
    let value: serde_json::Value = serde_json::from_str(target_config).map_err(|e| {
        err(Error::bad_config(
            "<target config>",
            "<root>",
            e.to_string(),
        ))
    })?;
    TargetSpec::from_value(&value, "<target config>").map_err(err)
}

/// Where the confidence calibration of a load comes from (the `sts` argument).
pub(crate) enum Sts {
    /// `None`: `sts.json` next to the checkpoint, when present.
    File,
    /// `False`: none; the file is not read.
    Off,
    /// A path or a list of temperatures: this table; the file next to the checkpoint is not
    /// read.
    Table(StsCalibration),
}

impl Sts {
    /// Read the `sts` argument (a path is read now, before any weight is).
    pub(crate) fn from_py(sts: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let Some(sts) = sts.filter(|s| !s.is_none()) else {
            return Ok(Sts::File);
        };
        if sts.is_instance_of::<pyo3::types::PyBool>() {
            if args::boolean(sts, "sts")? {
                return Err(err(Error::invalid(
                    "sts",
                    "True is not a calibration (None: sts.json if present, False: off, a path \
                     or a list of temperatures)",
                )));
            }
            return Ok(Sts::Off);
        }
        let table = if args::is_sequence(sts) {
            let mut temps = Vec::new();
            for item in sts.try_iter()? {
                temps.push(args::float32(&item?, "sts")?);
            }
            StsCalibration::new(temps)
        } else {
            StsCalibration::from_json_path(args::path(sts, "sts")?)
        };
        table.map(Sts::Table).map_err(err)
    }

    /// Load the drafter at `dir` with this calibration (the GIL released while it loads).
    pub(crate) fn load(
        self,
        py: Python<'_>,
        dir: &std::path::Path,
        target: &TargetSpec,
        shared: SharedWeights,
        device: &Device,
        options: LoadOptions,
    ) -> PyResult<Qwen3Drafter> {
        let file = matches!(self, Sts::File);
        let mut drafter = py
            .detach(|| {
                Qwen3Drafter::builder(target)
                    .shared(shared)
                    .device(device)
                    .options(options)
                    .calibrated(file)
                    .load(dir)
            })
            .map_err(err)?;
        if let Sts::Table(table) = self {
            drafter.set_sts(Some(table)).map_err(err)?;
        }
        Ok(drafter)
    }
}

/// `start_positions`: `None` (0), one value, or one per request.
pub(crate) fn start_positions_of(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<usize>> {
    match obj.filter(|s| !s.is_none()) {
        None => Ok(vec![0]),
        Some(s) => one_or_many(s, "start_positions")?
            .into_iter()
            .map(|x| {
                usize::try_from(x)
                    .map_err(|_| err(Error::too_large("start_positions", x, usize::MAX, "")))
            })
            .collect(),
    }
}

/// `Drafter.propose` over a CUDA context (see there): the CUDA context borrowed in place, the
/// proposal made on the drafter's device, its draft logits exported as a `DeviceArray`.
#[cfg(feature = "cuda")]
pub(crate) fn propose_device<'py>(
    py: Python<'py>,
    drafter: &Qwen3Drafter,
    context: &Bound<'py, PyAny>,
    anchors: &[u32],
    starts: &[usize],
    opts: &ProposeOptions,
) -> PyResult<Bound<'py, PyAny>> {
    use pyo3::IntoPyObject;
    let ctx = crate::dlpack::cuda::import(context, "context_hidden_states", drafter.device())?;
    let t = ctx.tensor();
    let (p, kept) = py
        .detach(|| drafter.propose_kept(t, anchors, starts, opts))
        .map_err(err)?;
    drop(ctx);
    let (b, k, v) = (p.batch, p.slots, p.target_vocab);
    let tokens: Vec<i64> = p.tokens.iter().map(|&t| i64::from(t)).collect();
    let tokens = PyArray1::from_vec(py, tokens).reshape([b, k])?;
    let logits = match kept {
        Some(t) => Bound::new(py, crate::dlpack::cuda::DeviceArray::new(t)?)?.into_any(),
        None => PyArray1::from_vec(py, p.draft_logits)
            .reshape([b, k, v])?
            .into_any(),
    };
    let confidence = match p.confidence {
        Some(c) => Some(PyArray1::from_vec(py, c).reshape([b, k])?),
        None => None,
    };
    Ok((tokens, logits, confidence).into_pyobject(py)?.into_any())
}
