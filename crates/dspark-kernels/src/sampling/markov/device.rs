//! The Markov block sampler on the device-generic tensor path (the semantics of
//! `sampling::markov`).
//!
//! Per slot: `e = W1[prev]` (an index select), the biased draft-space logits
//! `mult·(base + e·W2ᵀ)` for every request in one matmul, the same masks (padded columns, base
//! top-k candidates), then the argmax (lowest id) or one inverse-CDF draw with the fast path's
//! uniform, the draft→target map as an index select. Everything stays on the device across
//! slots; the tokens and per-row checks come back in one copy at the end, and errors are
//! reported in the fast path's order. [`DeviceBlock`] keeps the `[B, K, V_t]` draft logits on
//! the device.

use candle_core::{DType, Tensor};

use super::options::block_struct;
use super::{DraftBlock, Geometry, TensorInputs};
use crate::error::Result;
use crate::sampling::dist::{Scope, check_row};
use crate::sampling::ops::{
    argmax_lowest, clean_rows, column_f64, pad_rows, pick, row_sums, top_k_cut, weights,
};
use crate::sampling::rng::{Stream, Tag};
use crate::sampling::transfer::{Download, Fetched};

/// A drafted block whose large outputs stay on the device.
#[derive(Debug, Clone)]
pub struct DeviceBlock {
    /// `B`.
    pub batch: usize,
    /// `K`.
    pub slots: usize,
    /// `V_t`.
    pub target_vocab: usize,
    /// Markov rank `r`.
    pub rank: usize,
    /// `[B·K]` drafted target ids.
    pub tokens: Vec<u32>,
    /// `[B, K, V_t]` f32: the draft logits of [`DraftBlock::draft_logits`].
    pub draft_logits: Tensor,
    /// `[B, K, r]` f32: the embeddings of [`DraftBlock::prev_embeddings`].
    pub prev_embeddings: Tensor,
}

impl DeviceBlock {
    /// A block of geometry `g` with these outputs.
    pub(crate) fn new(
        g: &Geometry,
        tokens: Vec<u32>,
        draft_logits: Tensor,
        prev_embeddings: Tensor,
    ) -> Self {
        block_struct!(DeviceBlock, g, tokens, draft_logits, prev_embeddings)
    }

    /// A block drafted on the host, its large outputs as tensors on `dev`.
    pub(crate) fn from_host(b: DraftBlock, dev: &candle_core::Device) -> Result<Self> {
        let draft_logits =
            Tensor::from_vec(b.draft_logits, (b.batch, b.slots, b.target_vocab), dev)?;
        let prev_embeddings = Tensor::from_vec(b.prev_embeddings, (b.batch, b.slots, b.rank), dev)?;
        Ok(DeviceBlock {
            batch: b.batch,
            slots: b.slots,
            target_vocab: b.target_vocab,
            rank: b.rank,
            tokens: b.tokens,
            draft_logits,
            prev_embeddings,
        })
    }

    /// Copy the outputs to the host.
    pub fn to_host(&self) -> Result<DraftBlock> {
        Ok(DraftBlock {
            batch: self.batch,
            slots: self.slots,
            target_vocab: self.target_vocab,
            rank: self.rank,
            tokens: self.tokens.clone(),
            draft_logits: self.draft_logits.flatten_all()?.to_vec1::<f32>()?,
            prev_embeddings: self.prev_embeddings.flatten_all()?.to_vec1::<f32>()?,
        })
    }
}

/// Draw a block on the device of `base` (`[B, K, V_d]`); `w1` `[V_in, r]` and `w2` `[V_d, r]`
/// on the same device, any of f32/f16/bf16. `g` and `streams` come from the shared validation.
pub(crate) fn sample_block_tensors(
    g: &Geometry,
    streams: &[Stream],
    x: &TensorInputs<'_>,
) -> Result<DeviceBlock> {
    let (b_n, k_n, vt, r, valid) = (g.batch, g.slots, g.target_vocab, g.rank, g.valid);
    let dev = x.base.device();
    if b_n == 0 || k_n == 0 {
        let zeros = |d: usize| Tensor::zeros((b_n, k_n, d), DType::F32, dev);
        return Ok(DeviceBlock::new(g, Vec::new(), zeros(vt)?, zeros(r)?));
    }
    let (greedy, mult) = x.opts.draft_mult();
    let base = x.base.narrow(2, 0, valid)?.to_dtype(DType::F32)?;
    let w2t = x.w2.narrow(0, 0, valid)?.to_dtype(DType::F32)?.t()?;
    let mut dl = Download::default();
    // Base top-k candidates of every (b, k) row, validated before any slot (fast path order).
    let cands = match x.opts.top_k.filter(|&k| k < valid) {
        Some(k) => {
            let rows = pad_rows(&base.reshape((b_n * k_n, valid))?, f32::NEG_INFINITY)?;
            let (x, max, nans) = clean_rows(&rows)?;
            let kcol = column_f64(&vec![k as f64; b_n * k_n], dev)?;
            let keep = top_k_cut(&x, &kcol)?.keeps(&x)?.narrow(1, 0, valid)?;
            let slots = (dl.push(&max)?, dl.push(&nans)?);
            Some((keep.reshape((b_n, k_n, valid))?, slots))
        }
        None => None,
    };
    let table = x.opts.id_map.table();
    let map = match table {
        Some(t) => Some(Tensor::from_slice(&t[..valid], valid, dev)?),
        None => None,
    };
    // Target id → the draft column written there (last writer wins, as in the fast path).
    let t2d = match table {
        Some(t) => {
            let mut inv = vec![valid as u32; vt];
            for (d, &tid) in t[..valid].iter().enumerate() {
                inv[tid as usize] = d as u32;
            }
            Some(Tensor::from_slice(&inv, vt, dev)?)
        }
        None => None,
    };
    let ninf_col = Tensor::full(f32::NEG_INFINITY, (b_n, 1), dev)?;
    let mut prev = Tensor::from_slice(x.anchors, b_n, dev)?;
    let (mut embs, mut rows, mut slot_stats, mut toks) = (vec![], vec![], vec![], vec![]);
    for k in 0..k_n {
        let bk = base.narrow(1, k, 1)?.reshape((b_n, valid))?;
        let (e, bias) = if r == 0 {
            let e = Tensor::zeros((b_n, 0), DType::F32, dev)?;
            (e, bk.zeros_like()?)
        } else {
            let e = x.w1.index_select(&prev, 0)?.to_dtype(DType::F32)?; // [B, r]
            let bias = e.matmul(&w2t)?;
            (e, bias)
        };
        let mut l = ((bk + bias)? * f64::from(mult))?;
        if let Some((keep, _)) = &cands {
            let ninf = Tensor::full(f32::NEG_INFINITY, (b_n, valid), dev)?;
            let kk = keep.narrow(1, k, 1)?.reshape((b_n, valid))?;
            l = kk.where_cond(&l, &ninf)?;
        }
        embs.push(e);
        let (x, max, nans) = clean_rows(&pad_rows(&l, f32::NEG_INFINITY)?)?;
        slot_stats.push((dl.push(&max)?, dl.push(&nans)?));
        let argmax = argmax_lowest(&x, &max)?;
        let d = if greedy {
            argmax
        } else {
            let u: Vec<f64> = streams
                .iter()
                .map(|s| s.uniform(Tag::Draft, k as u64, 0))
                .collect();
            let ones = Tensor::ones((b_n, 1), DType::F32, dev)?;
            let w = weights(&x, &max, &ones)?;
            let target = (column_f64(&u, dev)? * row_sums(&w)?)?;
            pick(&w, &target, &argmax)?
        };
        let d = d.minimum((valid - 1) as u32)?.flatten_all()?;
        let t = match &map {
            Some(m) => m.index_select(&d, 0)?,
            None => d,
        };
        let row = if greedy {
            let ids = Tensor::arange(0u32, vt as u32, dev)?.reshape((1, vt))?;
            let hot = ids.broadcast_eq(&t.reshape((b_n, 1))?)?;
            let zeros = Tensor::zeros((b_n, vt), DType::F32, dev)?;
            hot.where_cond(&zeros, &Tensor::full(f32::NEG_INFINITY, (b_n, vt), dev)?)?
        } else {
            match &t2d {
                Some(inv) => Tensor::cat(&[&l, &ninf_col], 1)?.index_select(inv, 1)?,
                None => l,
            }
        };
        rows.push(row);
        toks.push(dl.push(&t)?);
        prev = t;
    }
    let got = dl.fetch()?;
    if let Some((_, (max, nans))) = &cands {
        for i in 0..b_n * k_n {
            let (b, k) = (i / k_n, i % k_n);
            check(&got, *max, *nans, i, "base logits", b, k)?;
        }
    }
    for (k, (max, nans)) in slot_stats.iter().enumerate() {
        for b in 0..b_n {
            check(&got, *max, *nans, b, "draft logits", b, k)?;
        }
    }
    let mut tokens = vec![0u32; b_n * k_n];
    for (k, &slot) in toks.iter().enumerate() {
        for (b, &t) in got.get(slot).iter().enumerate() {
            tokens[b * k_n + k] = t as u32;
        }
    }
    let (draft_logits, prev_embeddings) = (Tensor::stack(&rows, 1)?, Tensor::stack(&embs, 1)?);
    Ok(DeviceBlock::new(g, tokens, draft_logits, prev_embeddings))
}

/// The fast path's row checks (`what` names the row in the message).
fn check(
    got: &Fetched,
    max: usize,
    nans: usize,
    i: usize,
    what: &str,
    b: usize,
    k: usize,
) -> Result<()> {
    let (m, n) = (got.get(max)[i] as f32, got.get(nans)[i]);
    let (nan, empty) = (n > 0.0 || m == f32::INFINITY, m == f32::NEG_INFINITY);
    check_row("base_logits", nan, empty, Scope::Vocabulary, || {
        format!("{what} (request {b}, slot {k})")
    })
}
