//! The drafter's passes on the device-generic path (a GPU, or the CPU under
//! `DSPARK_KERNEL_PATH=tensor`), batched: every request of a call goes through each op at once.
//!
//! - The stateless [`Drafter::propose`](super::Drafter::propose) computes the context keys of
//!   all requests in one pass (one `fc` product, one norm, one rope gather, one k and one v
//!   product per layer), with no per-request state.
//! - The block pass runs one attention per layer over `B × heads`
//!   ([`batched_attention`]); requests whose cached contexts differ in length are padded to
//!   the longest and masked.
//! - Token ids and positions go up in one upload per call; rope rows are gathered from tables
//!   kept on the device ([`crate::nn::rope::RopeCache`]).
//!
//! The number of ops of a stateless proposal therefore does not depend on `B`; the cached
//! path adds one pad per request and layer to gather the states' keys (a state is one
//! request's own tensors). The host fast path keeps its per-request single-pass kernels
//! (`forward.rs`), which this path is tested against.

use candle_core::{DType, Tensor};

use super::cache::{DraftState, LayerKv};
use super::qwen3::Qwen3Drafter;
use super::{Proposal, ProposeOptions};
use crate::error::{Error, Result};
use crate::nn::attention::{Keys, batched_attention, padding_mask};
use crate::nn::decoder::Heads;
use crate::nn::{f32_of, rms_norm};

/// The batch's context keys and values, per draft layer `[B, kv_heads, S, hd]` (head-major,
/// as a [`DraftState`] keeps them), with the additive mask over `S` context keys plus the
/// block's (`None` when no request is padded).
pub(crate) struct BatchContext {
    pub(crate) layers: Vec<LayerKv>,
    pub(crate) mask: Option<Tensor>,
}

impl Qwen3Drafter {
    /// The attention shape of the draft layers.
    fn heads(&self) -> Heads {
        Heads {
            heads: self.spec.shape.num_attention_heads,
            kv_heads: self.spec.shape.num_key_value_heads,
            head_dim: self.spec.shape.head_dim,
            eps: self.spec.shape.rms_norm_eps,
        }
    }

    /// Rows of the block pass per request: `K`, or `K + 1` in the 1+K layout.
    pub(crate) fn q_len(&self) -> usize {
        let k_n = self.info.num_draft_tokens;
        if self.spec.sample_from_anchor {
            k_n
        } else {
            k_n + 1
        }
    }

    /// The cached states' keys gathered into one batch: each state's `[kv, len, hd]` padded
    /// with zeros to the longest, stacked, and masked past its length.
    pub(crate) fn gather_states(&self, states: &[&DraftState]) -> Result<BatchContext> {
        let s_max = states.iter().map(|s| s.len()).max().unwrap_or(0);
        let h = self.heads();
        let q_len = self.q_len();
        let lens: Vec<usize> = states.iter().map(|s| s.len()).collect();
        let mask = padding_mask(&lens, s_max, q_len, &self.device)?;
        if s_max == 0 {
            return Ok(BatchContext {
                layers: Vec::new(),
                mask,
            });
        }
        let pad = |t: Option<&Tensor>, len: usize| -> Result<Tensor> {
            Ok(match t {
                Some(t) if len == s_max => t.clone(),
                Some(t) => t.pad_with_zeros(1, 0, s_max - len)?,
                None => Tensor::zeros((h.kv_heads, s_max, h.head_dim), DType::F32, &self.device)?,
            })
        };
        let mut layers = Vec::with_capacity(self.layers.len());
        for li in 0..self.layers.len() {
            let mut ks = Vec::with_capacity(states.len());
            let mut vs = Vec::with_capacity(states.len());
            for s in states {
                let kv = s.layer(li)?;
                ks.push(pad(kv.as_ref().map(|c| &c.k), s.len())?);
                vs.push(pad(kv.as_ref().map(|c| &c.v), s.len())?);
            }
            layers.push(LayerKv {
                k: Tensor::stack(&ks, 0)?,
                v: Tensor::stack(&vs, 0)?,
            });
        }
        Ok(BatchContext { layers, mask })
    }

    /// The context keys of `B` requests at once: `features` `[B, T, L·H_t]` at positions
    /// `ctx_positions` (`u32 [B·T]` on the device, the values of `host`).
    fn context_batch(
        &self,
        features: &Tensor,
        ctx_positions: &Tensor,
        host: &[usize],
    ) -> Result<BatchContext> {
        let (b, t, w) = features.dims3()?;
        let h = self.heads();
        if t == 0 {
            return Ok(BatchContext {
                layers: Vec::new(),
                mask: None,
            });
        }
        let x = f32_of(&crate::trace::to_device(features, &self.device)?)?.reshape((b * t, w))?;
        let ctx = rms_norm(&self.fc.forward(&x)?, &self.hidden_norm, h.eps)?;
        let (cos, sin) = self.rope.tables_at(&self.rope_cache, ctx_positions, host)?;
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let [k, v] = layer.kv(&ctx)?;
            let k = crate::nn::decoder::norm_rope(
                &self.rope,
                &k.reshape((b * t, h.kv_heads, h.head_dim))?,
                &layer.k_norm,
                h.eps,
                &cos,
                &sin,
            )?;
            let head_major = |x: Tensor| -> Result<Tensor> {
                Ok(x.reshape((b, t, h.kv_heads, h.head_dim))?
                    .permute((0, 2, 1, 3))?
                    .contiguous()?)
            };
            layers.push(LayerKv {
                k: head_major(k)?,
                v: head_major(v)?,
            });
        }
        Ok(BatchContext { layers, mask: None })
    }

    /// The block pass over a gathered batch: block `[anchor_b, M, …]` at positions
    /// `ends[b] ..`; post-norm hidden states `[B, K, H]` of the prediction slots.
    /// `ids_and_positions` is the call's one upload, `u32 [2·B·Q (+ more)]`: the block's ids,
    /// then its positions (the values of `host`; a stateless call appends the context
    /// positions).
    pub(crate) fn block_hidden_batched(
        &self,
        ctx: &BatchContext,
        ids_and_positions: &Tensor,
        host: &[usize],
        b_n: usize,
    ) -> Result<Tensor> {
        let q_len = self.q_len();
        let h = self.heads();
        let n = b_n * q_len;
        let ids = ids_and_positions.narrow(0, 0, n)?;
        let positions = ids_and_positions.narrow(0, n, n)?;
        let mut x = self.embed.lookup(&ids, "input_ids")?;
        let (cos, sin) = self
            .rope
            .tables_at(&self.rope_cache, &positions, &host[..n])?;
        let scale = 1.0 / (h.head_dim as f64).sqrt();
        for (li, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x, h, &self.rope, &cos, &sin, |q, k, v| {
                let head_major = |x: &Tensor| -> Result<Tensor> {
                    Ok(x.reshape((b_n, q_len, h.kv_heads, h.head_dim))?
                        .permute((0, 2, 1, 3))?)
                };
                let (kb, vb) = (head_major(k)?, head_major(v)?);
                let (k_all, v_all) = match ctx.layers.get(li) {
                    Some(c) => (Tensor::cat(&[&c.k, &kb], 2)?, Tensor::cat(&[&c.v, &vb], 2)?),
                    None => (kb.contiguous()?, vb.contiguous()?),
                };
                let q = q.reshape((b_n, q_len, h.heads, h.head_dim))?;
                batched_attention(&q, Keys::Rows(&k_all), &v_all, ctx.mask.as_ref(), scale)
            })?;
        }
        let x = rms_norm(&x, &self.norm, h.eps)?;
        let k_n = self.info.num_draft_tokens;
        Ok(x.reshape((b_n, q_len, self.spec.shape.hidden_size))?
            .narrow(1, q_len - k_n, k_n)?
            .contiguous()?)
    }

    /// The block's input ids: `[anchor_b, M, …]` (`Q` per request) for each request.
    pub(crate) fn block_ids(&self, anchors: &[u32]) -> Vec<u32> {
        let (q_len, noise) = (self.q_len(), self.spec.noise_token.id);
        let mut ids = Vec::with_capacity(2 * anchors.len() * q_len);
        for &a in anchors {
            ids.push(a);
            ids.extend(std::iter::repeat_n(noise, q_len - 1));
        }
        ids
    }

    /// The ids and positions of a block pass (and `extra` positions after them) as one upload:
    /// `[anchor_b, M, …]` for each request, then positions `ends[b] .. ends[b] + Q`, then
    /// `extra`. Returns the tensor and its positions on the host.
    pub(crate) fn upload_block(
        &self,
        anchors: &[u32],
        ends: &[usize],
        extra: impl Iterator<Item = usize>,
    ) -> Result<(Tensor, Vec<usize>)> {
        let q_len = self.q_len();
        let mut v = self.block_ids(anchors);
        let positions: Vec<usize> = ends
            .iter()
            .flat_map(|&e| e..e + q_len)
            .chain(extra)
            .collect();
        for &p in &positions {
            v.push(
                u32::try_from(p)
                    .map_err(|_| Error::too_large("position", p as u64, u64::from(u32::MAX), ""))?,
            );
        }
        let len = v.len();
        Ok((crate::trace::upload(v, len, &self.device)?, positions))
    }

    /// [`Drafter::propose`] on the device-generic path: every request's context and block in
    /// one batched pass (see the module docs). Same checks and same proposal as the
    /// per-request path; the draft logits stay on the device (returned beside a proposal
    /// whose `draft_logits` is empty).
    pub(crate) fn propose_stateless_batched(
        &self,
        context: &Tensor,
        anchors: &[u32],
        start_positions: &[usize],
        opts: &ProposeOptions,
    ) -> Result<(Proposal, Option<Tensor>)> {
        let (b_n, t, w) = super::check_stateless(context, start_positions)?;
        self.check_width(w)?;
        self.check_anchors(anchors, b_n)?;
        let start = |b: usize| start_positions[if start_positions.len() == 1 { 0 } else { b }];
        for b in 0..b_n {
            crate::limits::at_most(
                "start_position",
                start(b) as u64,
                crate::limits::MAX_POSITION,
            )?;
        }
        let ends: Vec<usize> = (0..b_n).map(|b| start(b) + t).collect();
        let ctx_positions = (0..b_n).flat_map(|b| start(b)..start(b) + t);
        let (up, host) = self.upload_block(anchors, &ends, ctx_positions)?;
        let (n, bq) = (2 * b_n * self.q_len(), b_n * self.q_len());
        let ctx = self.context_batch(context, &up.narrow(0, n, b_n * t)?, &host[bq..])?;
        let hidden = self.block_hidden_batched(&ctx, &up, &host, b_n)?;
        let heads = self.device_heads.as_ref().ok_or_else(|| Error::Internal {
            message: "the batched drafter pass runs on the tensor path only".into(),
        })?;
        self.propose_on_device(heads, &hidden, anchors, opts, true)
    }
}
