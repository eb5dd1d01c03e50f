//! A call's rows that follow nothing drawn apart from those that do. A block with in-block
//! penalties or a guide is drawn slot by slot, each slot from its own stream; a plain block in
//! one pass. Were a plain request drawn slot by slot because another request of its call
//! follows something, its drafts (and with them its sampled output) would depend on its batch.
//! With per-request seeds (the engine's), the plain rows are drawn in one pass as alone, the
//! others slot by slot, and the block is put back in row order.

use candle_core::Tensor;

use super::follow::{Follow, InBlockPenalty};
use super::guide::Guide;
use crate::error::Result;
use crate::sampling::{BlockOptions, DeviceBlock, DraftBlock, Seeds};

/// The rows of a call of `b_n` that follow nothing and those that follow something, when
/// both exist and the call's seeds are per request (scalar seeds number their streams by row:
/// a subset would draw from other rows' streams).
pub(super) fn split(follow: &Follow<'_>, b_n: usize, seeds: &Seeds) -> Option<[Vec<usize>; 2]> {
    if !matches!(seeds, Seeds::PerRequest(_)) {
        return None;
    }
    let (fol, free): (Vec<usize>, Vec<usize>) = (0..b_n).partition(|&b| {
        follow.pens.get(b).is_some_and(InBlockPenalty::is_active)
            || follow
                .guides
                .and_then(|g| g.get(b))
                .is_some_and(Option::is_some)
    });
    (!free.is_empty() && !fol.is_empty()).then_some([free, fol])
}

/// The options of a call that draws `rows` of `opts`'s call (per-request seeds).
pub(super) fn rows_options<'a>(opts: &BlockOptions<'a>, rows: &[usize]) -> BlockOptions<'a> {
    let seeds = match &opts.seeds {
        Seeds::PerRequest(v) => Seeds::PerRequest(rows.iter().map(|&b| v[b]).collect()),
        s @ Seeds::Scalar(_) => s.clone(),
    };
    BlockOptions {
        seeds,
        ..opts.clone()
    }
}

/// `anchors` of `rows`.
pub(super) fn pick(anchors: &[u32], rows: &[usize]) -> Vec<u32> {
    rows.iter().map(|&b| anchors[b]).collect()
}

/// The penalties and guides of `rows`, owned (borrowed by [`Follow`]).
pub(super) fn sub_follow(
    follow: &Follow<'_>,
    rows: &[usize],
) -> (Vec<InBlockPenalty>, Option<Vec<Option<Guide>>>) {
    let pens = rows
        .iter()
        .map(|&b| follow.pens.get(b).cloned().unwrap_or_default())
        .collect();
    let guides = follow
        .guides
        .map(|g| rows.iter().map(|&b| g.get(b).cloned().flatten()).collect());
    (pens, guides)
}

/// The host blocks of `parts` (each the block of its rows, in their order) in row order.
pub(super) fn merge_host(b_n: usize, parts: [(&[usize], DraftBlock); 2]) -> DraftBlock {
    let k_n = parts[0].1.slots;
    let (vt, r) = (parts[0].1.target_vocab, parts[0].1.rank);
    let mut out = DraftBlock {
        batch: b_n,
        slots: k_n,
        target_vocab: vt,
        rank: r,
        tokens: vec![0; b_n * k_n],
        draft_logits: vec![0.0; b_n * k_n * vt],
        prev_embeddings: vec![0.0; b_n * k_n * r],
    };
    for (rows, block) in parts {
        for (j, &b) in rows.iter().enumerate() {
            let (at, from) = (b * k_n, j * k_n);
            out.tokens[at..at + k_n].copy_from_slice(&block.tokens[from..from + k_n]);
            out.draft_logits[at * vt..(at + k_n) * vt]
                .copy_from_slice(&block.draft_logits[from * vt..(from + k_n) * vt]);
            out.prev_embeddings[at * r..(at + k_n) * r]
                .copy_from_slice(&block.prev_embeddings[from * r..(from + k_n) * r]);
        }
    }
    out
}

/// The device blocks of `parts` in row order (one `cat` and one `index_select` per output).
pub(super) fn merge_device(b_n: usize, parts: [(&[usize], DeviceBlock); 2]) -> Result<DeviceBlock> {
    let [(a_rows, a), (b_rows, b)] = parts;
    let k_n = a.slots;
    let mut tokens = vec![0u32; b_n * k_n];
    // Where each row sits in the concatenation of the parts.
    let mut at = vec![0u32; b_n];
    for (j, &row) in a_rows.iter().chain(b_rows).enumerate() {
        at[row] = j as u32;
        let from = if j < a_rows.len() {
            &a.tokens[j * k_n..(j + 1) * k_n]
        } else {
            let j = j - a_rows.len();
            &b.tokens[j * k_n..(j + 1) * k_n]
        };
        tokens[row * k_n..(row + 1) * k_n].copy_from_slice(from);
    }
    let index = Tensor::from_vec(at, b_n, a.draft_logits.device())?;
    let order = |x: &Tensor, y: &Tensor| -> Result<Tensor> {
        Ok(Tensor::cat(&[x, y], 0)?.index_select(&index, 0)?)
    };
    Ok(DeviceBlock {
        batch: b_n,
        slots: k_n,
        target_vocab: a.target_vocab,
        rank: a.rank,
        tokens,
        draft_logits: order(&a.draft_logits, &b.draft_logits)?,
        prev_embeddings: order(&a.prev_embeddings, &b.prev_embeddings)?,
    })
}
