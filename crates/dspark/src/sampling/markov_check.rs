//! Validation of the Markov block sampler's inputs (shapes, ids, options, id map) and of the
//! size of its outputs (`too-large` above [`crate::limits::MAX_OUTPUT_ELEMENTS`]).

use super::markov::BlockOptions;
use super::view::{Mat, Rows3};
use crate::error::{Error, Result};
use crate::limits::output_elements;

/// Validated geometry.
pub(crate) struct Geometry {
    pub batch: usize,
    pub slots: usize,
    /// `V_t`.
    pub target_vocab: usize,
    /// Draft columns that may be sampled: `[0, valid)`.
    pub valid: usize,
    pub rank: usize,
}

pub(crate) fn validate(
    base: &Rows3<'_>,
    w1: &Mat<'_>,
    w2: &Mat<'_>,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<Geometry> {
    base.check("base_logits")?;
    w1.check("markov_w1")?;
    w2.check("markov_w2")?;
    validate_dims(base.dims, w1.dims, w2.dims, anchors, opts)
}

/// The checks of [`validate`] that need only the shapes (shared with the tensor path).
pub(crate) fn validate_dims(
    base: [usize; 3],
    w1: [usize; 2],
    w2: [usize; 2],
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<Geometry> {
    let [batch, slots, draft_vocab] = base;
    let [input_vocab, rank] = w1;
    if w2[0] != draft_vocab {
        return Err(Error::bad_shape(
            "markov_w2",
            format!(
                "{} rows, but base logits have V_d = {draft_vocab} columns",
                w2[0]
            ),
        ));
    }
    if w2[1] != rank {
        return Err(Error::bad_shape(
            "markov_w2",
            format!("rank {} differs from markov_w1 rank {rank}", w2[1]),
        ));
    }
    if anchors.len() != batch {
        return Err(Error::bad_shape(
            "anchors",
            format!("{} anchors for a batch of {batch}", anchors.len()),
        ));
    }
    if let Some(&a) = anchors.iter().find(|&&a| a as usize >= input_vocab) {
        return Err(Error::TokenOutOfRange {
            name: "anchors".into(),
            id: i64::from(a),
            vocab_size: input_vocab,
        });
    }
    let t = opts.temperature;
    if !(t.is_finite() && t >= 0.0) {
        return Err(Error::invalid(
            "temperature",
            format!("{t} (must be finite and >= 0)"),
        ));
    }
    let s = opts.logit_scale;
    if !(s.is_finite() && s > 0.0) {
        return Err(Error::invalid(
            "logit_scale",
            format!("{s} (must be finite and > 0)"),
        ));
    }
    if opts.top_k == Some(0) {
        return Err(Error::invalid("top_k", "0 (use None for the dense path)"));
    }
    let target_vocab = opts.id_map.target_vocab();
    let (valid, max_target) = match opts.id_map.table() {
        None => {
            if draft_vocab < target_vocab {
                return Err(Error::invalid(
                    "id_map",
                    format!(
                        "identity map but draft vocab V_d = {draft_vocab} < target vocab \
                         V_t = {target_vocab}: a reduced vocabulary needs its d2t table"
                    ),
                ));
            }
            (target_vocab, target_vocab.checked_sub(1))
        }
        Some(table) => {
            if table.len() != draft_vocab {
                return Err(Error::invalid(
                    "id_map",
                    format!(
                        "d2t table has {} entries but base logits have V_d = {draft_vocab} columns",
                        table.len()
                    ),
                ));
            }
            (draft_vocab, table.iter().max().map(|&m| m as usize))
        }
    };
    if valid == 0 {
        return Err(Error::invalid(
            "id_map",
            "no draft column maps to a target id",
        ));
    }
    if let Some(m) = max_target.filter(|&m| m >= input_vocab) {
        return Err(Error::bad_shape(
            "markov_w1",
            format!("{input_vocab} rows, but the drafter can emit target id {m}"),
        ));
    }
    // Outputs: `[B, K, V_t]` draft logits (`V_t` may exceed `V_d` with a table) and
    // `[B, K, r]` embeddings; sized with checked arithmetic before anything is allocated.
    let (b64, k64) = (batch as u64, slots as u64);
    output_elements("target_vocab_size", &[b64, k64, target_vocab as u64])?;
    output_elements("markov_w1", &[b64, k64, rank as u64])?;
    Ok(Geometry {
        batch,
        slots,
        target_vocab,
        valid,
        rank,
    })
}
