//! The token-id arguments of the kernel bindings, shared by the host (`kernels.rs`) and device
//! (`kernels_device.rs`) paths: a block call's anchors and id map, a verify call's draft ids.

use pyo3::prelude::*;

use dspark::Error;

use crate::args;
use crate::errors::err;

/// The anchors and id map of a block call as the engine takes them: `base` is `[B, K, V_d]`,
/// `w1` is `[V_in, r]`. Ids are copied once (the kernel checks them against `V_in`, after the
/// output sizes); the map is the engine's decision ([`dspark::IdMap::for_call`]).
pub(crate) fn block_ids(
    anchors: &Bound<'_, PyAny>,
    d2t: Option<&Bound<'_, PyAny>>,
    target_vocab_size: Option<usize>,
    base: [usize; 3],
    w1: [usize; 2],
) -> PyResult<(Vec<u32>, dspark::IdMap)> {
    let anchor_ids = args::ids_1d(anchors, "anchors")?;
    let anchor_ids = args::ids_u32(&anchor_ids, "anchors", w1[0])?;
    let offsets = d2t
        .filter(|d| !d.is_none())
        .map(|d| args::ids_1d(d, "d2t"))
        .transpose()?;
    let id_map =
        dspark::IdMap::for_call(offsets.as_deref(), base[2], target_vocab_size).map_err(err)?;
    Ok((anchor_ids, id_map))
}

/// The `[B, K]` draft ids of a verify call against target logits `[B, K+1, V]`: copied once
/// (a concurrent change of the caller's buffer is never read after validation), with their
/// real shape: `[B, K]`, never a transposed `[K, B]`.
pub(crate) fn draft_token_ids(
    draft_tokens: &Bound<'_, PyAny>,
    target_dims: [usize; 3],
) -> PyResult<(Vec<i64>, [usize; 2])> {
    if draft_tokens.is_none() {
        return Err(err(Error::invalid(
            "draft_tokens",
            "expected a [B, K] integer tensor, got None",
        )));
    }
    let (tokens, token_shape) = args::ids(draft_tokens, "draft_tokens")?;
    let shape = check_token_shape(&token_shape, target_dims)?;
    Ok((tokens, shape))
}

/// `draft_tokens`' shape checked against the target's `[B, K+1, V]`.
pub(crate) fn check_token_shape(
    token_shape: &[usize],
    target_dims: [usize; 3],
) -> PyResult<[usize; 2]> {
    let [batch, width, _] = target_dims;
    if token_shape.len() != 2 {
        return Err(err(Error::bad_shape(
            "draft_tokens",
            format!("expected 2 dimensions [B, K], got shape {token_shape:?}"),
        )));
    }
    if width > 0 && token_shape != [batch, width - 1] {
        return Err(err(Error::bad_shape(
            "draft_tokens",
            format!(
                "shape {token_shape:?}, expected [B, K] = [{batch}, {}] (target_logits is \
                 [B, K+1, V] = {target_dims:?})",
                width - 1,
            ),
        )));
    }
    Ok([token_shape[0], token_shape[1]])
}
