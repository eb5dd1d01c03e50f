//! The kernels for CUDA inputs: the same arguments and validation as `kernels`, read through
//! DLPack without a host copy and run on the engine's device-generic path.
//!
//! Only small results cross to the host (token ids, accepted counts, confidences: a few
//! numbers per row); `[B, K, V]` draft logits stay on the device and come back as a
//! [`DeviceArray`] (`torch.from_dlpack`).

use candle_core::{Device, Tensor};
use numpy::PyArrayMethods;
use pyo3::prelude::*;

use dspark::Error;
use dspark::sampling::{BlockOptions, PerRequest, Seeds, StsCalibration, VerifyOptions};

use crate::args;
use crate::dlpack::cuda::{DeviceArray, DeviceTensor, import};
use crate::errors::PyDSparkError;
use crate::kernel_ids::{block_ids, check_token_shape, draft_token_ids};

fn err(e: Error) -> PyErr {
    PyDSparkError(e).into()
}

fn optional(
    obj: Option<&Bound<'_, PyAny>>,
    name: &str,
    device: &Device,
) -> PyResult<Option<DeviceTensor>> {
    obj.filter(|o| !o.is_none())
        .map(|o| import(o, name, device))
        .transpose()
}

fn dims<const N: usize>(t: &Tensor, name: &str) -> PyResult<[usize; N]> {
    <[usize; N]>::try_from(t.dims()).map_err(|_| {
        err(Error::bad_shape(
            name,
            format!("shape {:?}, expected {N} dimensions", t.dims()),
        ))
    })
}

/// Per-request verify options in parse order: temperature, top-k, top-p, seeds, num_draft,
/// stop ids.
pub type VerifyParts = (
    PerRequest<f32>,
    PerRequest<Option<usize>>,
    PerRequest<f32>,
    Seeds,
    Option<Vec<usize>>,
    Vec<i64>,
);

/// `dspark.verify` on a CUDA `target_logits` (and `draft_logits`, on the same device).
pub fn verify(
    py: Python<'_>,
    device: &Device,
    tensors: (
        &Bound<'_, PyAny>,
        &Bound<'_, PyAny>,
        Option<&Bound<'_, PyAny>>,
    ),
    parts: VerifyParts,
) -> PyResult<dspark::sampling::Verification> {
    let (target_logits, draft_tokens, draft_logits) = tensors;
    let (temperature, top_k, top_p, seeds, num_draft, stops) = parts;
    let target = import(target_logits, "target_logits", device)?;
    let td = dims::<3>(target.tensor(), "target_logits")?;
    // Draft ids on the same device are read there (the kernels check their range); host ids
    // are copied once.
    let on_device = crate::dlpack::cuda::cuda_device_of(draft_tokens, "draft_tokens")?
        .is_some_and(|d| d.same_device(device));
    let tokens = if on_device {
        let t = import(draft_tokens, "draft_tokens", device)?;
        check_token_shape(t.tensor().dims(), td)?;
        Tokens::Device(t)
    } else {
        let (ids, shape) = draft_token_ids(draft_tokens, td)?;
        Tokens::Host(ids, shape)
    };
    let stop_token_ids = args::ids_in_vocab(&stops, "stop_token_ids", td[2])?;
    let q = optional(draft_logits, "draft_logits", device)?;
    let opts = VerifyOptions {
        temperature,
        top_k,
        top_p,
        seeds,
        num_draft,
        stop_token_ids,
    };
    // Only the candle views cross into the detached closure (the DLPack owners stay here).
    let (target_t, q_t) = (target.tensor(), q.as_ref().map(|q| q.tensor()));
    let (device_ids, host_ids) = match &tokens {
        Tokens::Device(t) => (Some(t.tensor()), None),
        Tokens::Host(ids, shape) => (None, Some((ids.as_slice(), *shape))),
    };
    py.detach(|| {
        let ids = match (device_ids, host_ids) {
            (Some(t), _) => t.clone(),
            (None, Some((ids, shape))) => Tensor::from_slice(ids, (shape[0], shape[1]), device)?,
            (None, None) => return Err(Error::invalid("draft_tokens", "missing")),
        };
        dspark::sampling::verify(target_t, &ids, q_t, &opts)
    })
    .map_err(err)
}

/// Draft ids where they are.
enum Tokens {
    /// Borrowed from a CUDA tensor on the logits' device.
    Device(DeviceTensor),
    /// Read to the host.
    Host(Vec<i64>, [usize; 2]),
}

/// The tensors of a block call: base logits, W1, W2, anchors, d2t.
pub type BlockTensors<'a, 'py> = (
    &'a Bound<'py, PyAny>,
    &'a Bound<'py, PyAny>,
    &'a Bound<'py, PyAny>,
    &'a Bound<'py, PyAny>,
    Option<&'a Bound<'py, PyAny>>,
);

/// Scalar options of a block call: temperature, seeds, target vocab size, top-k, logit scale.
pub type BlockParts = (f32, Seeds, Option<usize>, Option<usize>, f32);

/// `dspark.sample_block` on CUDA inputs: `(tokens [B, K] numpy, draft_logits [B, K, V_t]
/// on the device, prev_embeddings [B, K, r] numpy)`.
pub fn sample_block<'py>(
    py: Python<'py>,
    device: &Device,
    tensors: BlockTensors<'_, 'py>,
    parts: BlockParts,
) -> PyResult<Bound<'py, PyAny>> {
    let (base_logits, markov_w1, markov_w2, anchors, d2t) = tensors;
    let (temperature, seeds, target_vocab_size, top_k, logit_scale) = parts;
    let base = import(base_logits, "base_logits", device)?;
    let w1 = import(markov_w1, "markov_w1", device)?;
    let w2 = import(markov_w2, "markov_w2", device)?;
    let bd = dims::<3>(base.tensor(), "base_logits")?;
    let d1 = dims::<2>(w1.tensor(), "markov_w1")?;
    let (anchor_ids, id_map) = block_ids(anchors, d2t, target_vocab_size, bd, d1)?;
    let opts = BlockOptions {
        temperature,
        seeds,
        id_map: &id_map,
        top_k,
        logit_scale,
    };
    let (base_t, w1_t, w2_t) = (base.tensor(), w1.tensor(), w2.tensor());
    let block = py
        .detach(|| dspark::sampling::sample_block_on_device(base_t, w1_t, w2_t, &anchor_ids, &opts))
        .map_err(err)?;
    let [b, k] = [bd[0], bd[1]];
    let tokens: Vec<i64> = block.tokens.iter().map(|&t| i64::from(t)).collect();
    let tokens = numpy::PyArray1::from_vec(py, tokens).reshape([b, k])?;
    let logits = Bound::new(py, DeviceArray::new(block.draft_logits)?)?;
    let prev = Bound::new(py, DeviceArray::new(block.prev_embeddings)?)?;
    Ok((tokens, logits, prev).into_pyobject(py)?.into_any())
}

/// `dspark.confidence` on a CUDA `hidden` (weight and embeddings on the same device):
/// `[B, K]` confidences on the host.
pub fn confidence(
    py: Python<'_>,
    device: &Device,
    tensors: (
        &Bound<'_, PyAny>,
        Option<&Bound<'_, PyAny>>,
        &Bound<'_, PyAny>,
    ),
    bias: f32,
    sts: Option<&StsCalibration>,
) -> PyResult<(Vec<f32>, [usize; 2])> {
    let (hidden, prev_embeddings, weight) = tensors;
    let h = import(hidden, "hidden", device)?;
    let w = import(weight, "weight", device)?;
    let prev = optional(prev_embeddings, "prev_embeddings", device)?;
    let hd = dims::<3>(h.tensor(), "hidden")?;
    let (h_t, prev_t, w_t) = (h.tensor(), prev.as_ref().map(|p| p.tensor()), w.tensor());
    let out = py
        .detach(|| {
            let b = Tensor::new(&[bias], device)?;
            let c = dspark::sampling::confidence(h_t, prev_t, w_t, Some(&b), sts)?;
            Ok::<_, Error>(c.flatten_all()?.to_vec1::<f32>()?)
        })
        .map_err(err)?;
    Ok((out, [hd[0], hd[1]]))
}
