//! [`ProposeOptions::in_block`](super::ProposeOptions): presence and frequency penalties that
//! follow the block as it is drafted. Verification scores slot `k` with the penalties of the
//! committed tokens *and* of the drafts before it; a drafter that only sees the committed ones
//! proposes, at slot `k`, a token the target has just penalized (at frequency 1.0 the bundled
//! pair's τ fell from 5.5 to 1.9). Here the sampler (host slices, or the tensor sampler on the
//! device-generic path) draws one slot at a time and, after each slot, lowers that slot's
//! drafted tokens in the base logits of the later slots, so each slot's reported distribution is
//! the one it was drawn from (verification stays exact). The same slot-by-slot draw keeps a
//! greedy block inside each request's guide ([`super::guide`]).

use candle_core::Tensor;

use super::bias::to_draft_id;
use super::follow::Follow;
use super::guide::{Guided, row_options};
use super::split::{merge_device, merge_host, pick, rows_options, split, sub_follow};
use crate::error::Result;
use crate::sampling::rng::round_seed;
use crate::sampling::{
    BlockOptions, DeviceBlock, DraftBlock, Floats, Mat, Rows3, Seeds, is_greedy_temperature,
    sample_block_on_device, sample_block_slices,
};

/// The seeds of slot `k`: slot 0 keeps the call's, later slots draw from their own streams
/// (a request's draws still depend on its seed and position alone).
fn slot_seeds(seeds: &Seeds, k: usize) -> Seeds {
    let mix = |s: u64| if k == 0 { s } else { round_seed(s, k as u64) };
    match seeds {
        Seeds::Scalar(s) => Seeds::Scalar(mix(*s)),
        Seeds::PerRequest(v) => Seeds::PerRequest(v.iter().map(|&s| mix(s)).collect()),
    }
}

/// What each request drafted so far in the block, and what the next draft subtracts.
struct Tracker<'a> {
    follow: &'a Follow<'a>,
    /// Per request: `(target id, times drafted)`.
    drafted: Vec<Vec<(u32, u32)>>,
    /// Draft rows (`V_d`).
    v: usize,
}

impl<'a> Tracker<'a> {
    fn new(follow: &'a Follow<'a>, b_n: usize, v: usize) -> Self {
        Self {
            follow,
            drafted: vec![Vec::new(); b_n],
            v,
        }
    }

    /// Request `b` drafted target id `t`: the draft row and the amount to subtract from it at
    /// the later slots (`None`: nothing changes).
    fn drew(&mut self, b: usize, t: u32) -> Option<(usize, f32)> {
        let pen = self.follow.pens.get(b).filter(|p| p.is_active())?;
        let row = &mut self.drafted[b];
        let count = match row.iter_mut().find(|e| e.0 == t) {
            Some(e) => {
                e.1 += 1;
                e.1 - 1
            }
            None => {
                row.push((t, 1));
                0
            }
        };
        let d = to_draft_id(self.follow.to_draft, t, self.v)?;
        Some((d, pen.step(t, count)))
    }
}

/// The options of slot `k`'s one-slot draw.
fn slot_options<'a>(opts: &BlockOptions<'a>, k: usize) -> BlockOptions<'a> {
    BlockOptions {
        seeds: slot_seeds(&opts.seeds, k),
        ..opts.clone()
    }
}

/// The block of `base` (`[B, K, V_d]` row-major, changed in place at later slots) drawn one slot
/// at a time with the in-block penalties and guides of `follow` (rows that follow nothing in
/// one pass, as in a plain call: [`super::split`]). Same outputs and layout as
/// [`sample_block_slices`].
pub(crate) fn sample_block_in_block(
    base: &mut [f32],
    dims: [usize; 3],
    (w1, w2): (Mat<'_>, Mat<'_>),
    anchors: &[u32],
    opts: &BlockOptions<'_>,
    follow: &Follow<'_>,
) -> Result<DraftBlock> {
    let [b_n, k_n, v] = dims;
    if let Some([free, fol]) = split(follow, b_n, &opts.seeds) {
        let gather = |rows: &[usize]| -> Vec<f32> {
            rows.iter()
                .flat_map(|&b| base[b * k_n * v..(b + 1) * k_n * v].iter().copied())
                .collect()
        };
        let free_base = gather(&free);
        let rows = Rows3 {
            data: Floats::F32(&free_base),
            dims: [free.len(), k_n, v],
        };
        let plain = sample_block_slices(
            rows,
            w1,
            w2,
            &pick(anchors, &free),
            &rows_options(opts, &free),
        )?;
        let mut fol_base = gather(&fol);
        let (pens, guides) = sub_follow(follow, &fol);
        let sub = Follow {
            pens: &pens,
            guides: guides.as_deref(),
            to_draft: follow.to_draft,
        };
        let dims = [fol.len(), k_n, v];
        let (anchors, opts) = (pick(anchors, &fol), rows_options(opts, &fol));
        // Every one of these rows follows something: drawn slot by slot below.
        let followed = sample_block_in_block(&mut fol_base, dims, (w1, w2), &anchors, &opts, &sub)?;
        return Ok(merge_host(b_n, [(&free, plain), (&fol, followed)]));
    }
    let mut tracker = Tracker::new(follow, b_n, v);
    let mut prev = anchors.to_vec();
    let mut out = DraftBlock {
        batch: b_n,
        slots: k_n,
        target_vocab: 0,
        rank: 0,
        tokens: vec![0; b_n * k_n],
        draft_logits: Vec::new(),
        prev_embeddings: Vec::new(),
    };
    let mut guided = Guided::new(follow.guides, b_n, !is_greedy_temperature(opts.temperature));
    let mut slot = vec![0f32; b_n * v];
    for k in 0..k_n {
        for b in 0..b_n {
            let at = (b * k_n + k) * v;
            let row = &mut slot[b * v..(b + 1) * v];
            row.copy_from_slice(&base[at..at + v]);
            if let Some(g) = guided.as_mut() {
                g.restrict_ahead(b, &out.tokens[b * k_n..b * k_n + k], row, opts.id_map);
            }
        }
        let rows = Rows3 {
            data: Floats::F32(&slot),
            dims: [b_n, 1, v],
        };
        let one = sample_block_slices(rows, w1, w2, &prev, &slot_options(opts, k))?;
        let (vt, r) = (one.target_vocab, one.rank);
        if k == 0 {
            (out.target_vocab, out.rank) = (vt, r);
            out.draft_logits = vec![0.0; b_n * k_n * vt];
            out.prev_embeddings = vec![0.0; b_n * k_n * r];
        }
        for (b, &t) in one.tokens.iter().enumerate() {
            let i = b * k_n + k;
            let row = || Ok(slot[b * v..(b + 1) * v].to_vec());
            let drafted = &out.tokens[b * k_n..i];
            let again = match guided.as_mut() {
                Some(g) => g.replacement(b, drafted, t, row, opts.id_map)?,
                None => None,
            };
            let again = match again {
                Some(base) => {
                    let rows = Rows3 {
                        data: Floats::F32(&base),
                        dims: [1, 1, v],
                    };
                    let one_opts = row_options(&slot_options(opts, k), b);
                    Some(sample_block_slices(rows, w1, w2, &[prev[b]], &one_opts)?)
                }
                None => None,
            };
            let (t, logits) = match &again {
                Some(a) => (a.tokens[0], &a.draft_logits[..vt]),
                None => (t, &one.draft_logits[b * vt..(b + 1) * vt]),
            };
            out.tokens[i] = t;
            out.draft_logits[i * vt..(i + 1) * vt].copy_from_slice(logits);
            out.prev_embeddings[i * r..(i + 1) * r]
                .copy_from_slice(&one.prev_embeddings[b * r..(b + 1) * r]);
            prev[b] = t;
            if let Some((d, sub)) = tracker.drew(b, t) {
                for later in k + 1..k_n {
                    base[(b * k_n + later) * v + d] -= sub;
                }
            }
        }
    }
    Ok(out)
}

/// [`sample_block_in_block`] on the device-generic path: `base` (`[B, K, V_d]`, on its device)
/// drawn one slot at a time by the tensor sampler, the later slots changed by one `index_add`
/// per slot (rows that follow nothing in one pass). Same outputs and layout as
/// [`sample_block_on_device`].
pub(crate) fn sample_block_in_block_on_device(
    base: &Tensor,
    (w1, w2): (&Tensor, &Tensor),
    anchors: &[u32],
    opts: &BlockOptions<'_>,
    follow: &Follow<'_>,
) -> Result<DeviceBlock> {
    let (b_n, k_n, v) = base.dims3()?;
    if let Some([free, fol]) = split(follow, b_n, &opts.seeds) {
        let gather = |rows: &[usize]| -> Result<Tensor> {
            let index: Vec<u32> = rows.iter().map(|&b| b as u32).collect();
            let index = Tensor::from_vec(index, rows.len(), base.device())?;
            Ok(base.index_select(&index, 0)?)
        };
        let plain = sample_block_on_device(
            &gather(&free)?,
            w1,
            w2,
            &pick(anchors, &free),
            &rows_options(opts, &free),
        )?;
        let (pens, guides) = sub_follow(follow, &fol);
        let sub = Follow {
            pens: &pens,
            guides: guides.as_deref(),
            to_draft: follow.to_draft,
        };
        let (anchors, opts) = (pick(anchors, &fol), rows_options(opts, &fol));
        // Every one of these rows follows something: drawn slot by slot below.
        let followed =
            sample_block_in_block_on_device(&gather(&fol)?, (w1, w2), &anchors, &opts, &sub)?;
        return merge_device(b_n, [(&free, plain), (&fol, followed)]);
    }
    let mut tracker = Tracker::new(follow, b_n, v);
    let mut base = base.clone();
    let mut prev = anchors.to_vec();
    let mut tokens = vec![0u32; b_n * k_n];
    let (mut logits, mut embeddings) = (Vec::with_capacity(k_n), Vec::with_capacity(k_n));
    let (mut vt, mut r) = (0, 0);
    let mut guided = Guided::new(follow.guides, b_n, !is_greedy_temperature(opts.temperature));
    for k in 0..k_n {
        let mut slot = base.narrow(1, k, 1)?.contiguous()?;
        if let Some(g) = guided.as_mut().filter(|g| g.ahead()) {
            // A sampled call: the guided rows restricted on the host, the slot sent back.
            let mut host = crate::trace::download_f32(&slot)?;
            let mut changed = false;
            for (b, row) in host.chunks_mut(v).enumerate() {
                changed |= g.restrict_ahead(b, &tokens[b * k_n..b * k_n + k], row, opts.id_map);
            }
            if changed {
                slot =
                    Tensor::from_vec(host, (b_n, 1, v), slot.device())?.to_dtype(slot.dtype())?;
            }
        }
        let one_opts = slot_options(opts, k);
        let mut one = sample_block_on_device(&slot, w1, w2, &prev, &one_opts)?;
        (vt, r) = (one.target_vocab, one.rank);
        let mut index = Vec::new();
        let mut amount = Vec::new();
        for b in 0..b_n {
            let mut t = one.tokens[b];
            let row = || crate::trace::download_f32(&slot.narrow(0, b, 1)?);
            let drafted = &tokens[b * k_n..b * k_n + k];
            if let Some(g) = guided.as_mut()
                && let Some(row) = g.replacement(b, drafted, t, row, opts.id_map)?
            {
                let row =
                    Tensor::from_vec(row, (1, 1, v), slot.device())?.to_dtype(slot.dtype())?;
                let again =
                    sample_block_on_device(&row, w1, w2, &[prev[b]], &row_options(&one_opts, b))?;
                t = again.tokens[0];
                one.draft_logits = replace_row(&one.draft_logits, b, &again.draft_logits)?;
            }
            tokens[b * k_n + k] = t;
            prev[b] = t;
            if let Some((d, sub)) = tracker.drew(b, t) {
                for later in k + 1..k_n {
                    index.push(((b * k_n + later) * v + d) as u32);
                    amount.push(-sub);
                }
            }
        }
        logits.push(one.draft_logits);
        embeddings.push(one.prev_embeddings);
        if !index.is_empty() {
            let n = index.len();
            let index = Tensor::from_vec(index, n, base.device())?;
            let amount = Tensor::from_vec(amount, n, base.device())?.to_dtype(base.dtype())?;
            base = base
                .flatten_all()?
                .index_add(&index, &amount, 0)?
                .reshape((b_n, k_n, v))?;
        }
    }
    Ok(DeviceBlock {
        batch: b_n,
        slots: k_n,
        target_vocab: vt,
        rank: r,
        tokens,
        draft_logits: Tensor::cat(&logits, 1)?,
        prev_embeddings: Tensor::cat(&embeddings, 1)?,
    })
}

/// `rows` (`[B, ..]`) with row `b` replaced by `row` (`[1, ..]`).
fn replace_row(rows: &Tensor, b: usize, row: &Tensor) -> Result<Tensor> {
    let n = rows.dim(0)?;
    let mut parts = Vec::with_capacity(3);
    if b > 0 {
        parts.push(rows.narrow(0, 0, b)?);
    }
    parts.push(row.clone());
    if b + 1 < n {
        parts.push(rows.narrow(0, b + 1, n - b - 1)?);
    }
    Ok(Tensor::cat(&parts, 0)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_zero_keeps_the_call_seeds_and_later_slots_differ() {
        let s = Seeds::PerRequest(vec![1, 2]);
        assert_eq!(slot_seeds(&s, 0), s);
        let (Seeds::PerRequest(a), Seeds::PerRequest(b)) = (slot_seeds(&s, 1), slot_seeds(&s, 2))
        else {
            panic!("per-request seeds stay per request");
        };
        assert!(a != b && a[0] != 1 && a[0] != a[1]);
    }
}
