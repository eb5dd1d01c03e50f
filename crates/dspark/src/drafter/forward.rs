//! The Qwen3 drafter's forward passes: appending context to a [`DraftState`], the block pass,
//! and turning block hidden states into a [`Proposal`] through the sampling kernels.

use candle_core::{DType, Tensor};

use super::cache::{DraftState, LayerKv};
use super::follow::{Follow, any_active};
use super::guide::{Guided, guide_block};
use super::in_block::{sample_block_in_block, sample_block_in_block_on_device};
use super::qwen3::DeviceHeads;
use super::qwen3::Qwen3Drafter;
use super::{Drafter, Proposal, ProposeOptions};
use crate::device::kernel_path;
use crate::error::{Error, Result};
use crate::nn::decoder::{Heads, norm_rope};
use crate::nn::{f32_of, gqa_attention, matmul_t, rms_norm};
use crate::sampling::{BlockOptions, Floats, Mat, Rows3, confidence_slices, sample_block_slices};

/// Host copy of a tensor's values (f32): one download off the host fast path.
fn host_f32(t: &Tensor) -> Result<Vec<f32>> {
    crate::trace::download_f32(t)
}

impl Qwen3Drafter {
    /// The Markov sampler's options of one drafting call (both kernel paths).
    fn block_options<'a>(&'a self, opts: &ProposeOptions) -> BlockOptions<'a> {
        BlockOptions {
            temperature: opts.temperature,
            seeds: opts.seeds.clone(),
            id_map: &self.id_map,
            top_k: opts.top_k,
            logit_scale: self.spec.logit_scale,
        }
    }

    /// What a drafting call's block follows slot by slot: its in-block penalties and its
    /// guides, when any request has one.
    fn follow<'a>(&'a self, opts: &'a ProposeOptions) -> Option<Follow<'a>> {
        let pens = opts.in_block.as_deref().filter(|p| any_active(p));
        let guides = opts
            .guides
            .as_deref()
            .filter(|g| g.iter().any(Option::is_some));
        if pens.is_none() && guides.is_none() {
            return None;
        }
        Some(Follow {
            pens: pens.unwrap_or(&[]),
            guides,
            to_draft: &self.to_draft,
        })
    }

    /// `[N, heads, hd]` → normed (per head) and rotated.
    fn norm_rope(&self, x: &Tensor, norm: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        norm_rope(&self.rope, x, norm, self.spec.shape.rms_norm_eps, cos, sin)
    }

    /// Append context features `[T, L·H_t]` at `start_position` (see [`Drafter::extend`]).
    pub(crate) fn extend_state(
        &self,
        state: &mut DraftState,
        features: &Tensor,
        start_position: usize,
    ) -> Result<()> {
        let width = self.spec.context_width();
        let (t, w) = features.dims2().map_err(|_| {
            Error::bad_shape(
                "features",
                format!("shape {:?}, expected [T, L·H_t = {width}]", features.dims()),
            )
        })?;
        self.check_width(w)?;
        if state.num_layers() != self.layers.len() {
            return Err(Error::invalid(
                "state",
                format!(
                    "made for {} draft layers, this drafter has {}",
                    state.num_layers(),
                    self.layers.len()
                ),
            ));
        }
        kernel_path()?;
        let skip = state.seek(start_position)?;
        if t <= skip {
            return Ok(());
        }
        let (start_position, t) = (start_position + skip, t - skip);
        let x = f32_of(&features.narrow(0, skip, t)?.to_device(&self.device)?)?;
        let ctx = rms_norm(
            &self.fc.forward(&x)?,
            &self.hidden_norm,
            self.spec.shape.rms_norm_eps,
        )?;
        let positions: Vec<usize> = (start_position..start_position + t).collect();
        let (cos, sin) = self.rope.tables(&positions, &self.device)?;
        let (kvh, hd) = (
            self.spec.shape.num_key_value_heads,
            self.spec.shape.head_dim,
        );
        let rows = |layer: &crate::nn::decoder::Layer| -> Result<(Tensor, Tensor)> {
            let [k, v] = layer.kv(&ctx)?;
            let k = self.norm_rope(&k.reshape((t, kvh, hd))?, &layer.k_norm, &cos, &sin)?;
            Ok((k, v.reshape((t, kvh, hd))?))
        };
        if crate::device::fast_on(&self.device) && !state.uses_tensors() {
            // Host panels, written in place (room for a block pass's scratch rows too).
            return state.append_host((kvh, hd), (t, self.q_len()), |li| {
                let (k, v) = rows(&self.layers[li])?;
                Ok((host_f32(&k)?, host_f32(&v)?))
            });
        }
        let mut kv = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (k, v) = rows(layer)?;
            kv.push(LayerKv {
                k: k.transpose(0, 1)?.contiguous()?,
                v: v.transpose(0, 1)?.contiguous()?,
            });
        }
        state.append(kv, t)
    }

    /// Context features are `L·H_t` wide.
    pub(crate) fn check_width(&self, w: usize) -> Result<()> {
        let width = self.spec.context_width();
        if w == width {
            return Ok(());
        }
        Err(Error::bad_shape(
            "features",
            format!(
                "width {w}, but the drafter fuses {} layers × H_t {} = {width}",
                self.spec.target_layer_ids.len(),
                self.spec.target_hidden_size
            ),
        ))
    }

    /// `anchors` holds one draft-input id per request of a batch of `b_n`.
    pub(crate) fn check_anchors(&self, anchors: &[u32], b_n: usize) -> Result<()> {
        if anchors.len() != b_n {
            return Err(Error::bad_shape(
                "anchors",
                format!("{} anchors for {b_n} states", anchors.len()),
            ));
        }
        let v_in = self.info.vocab.input;
        if let Some(&a) = anchors.iter().find(|&&a| a as usize >= v_in) {
            return Err(Error::TokenOutOfRange {
                name: "anchors".into(),
                id: i64::from(a),
                vocab_size: v_in,
            });
        }
        Ok(())
    }

    /// The block pass: post-norm hidden states `[B, K, H]` of the prediction slots, for block
    /// `[anchor_b, M, …, M]` at positions `states[b].end() ..` (`K` slots when sampling from
    /// the anchor; `K + 1` slots read from slot 1 on in the 1+K layout).
    pub fn block_hidden(&self, states: &[&DraftState], anchors: &[u32]) -> Result<Tensor> {
        let b_n = states.len();
        self.check_anchors(anchors, b_n)?;
        let (k_n, q_len) = (self.info().num_draft_tokens, self.q_len());
        let (heads, kvh, hd) = (
            self.spec.shape.num_attention_heads,
            self.spec.shape.num_key_value_heads,
            self.spec.shape.head_dim,
        );
        if let Some(s) = states.iter().find(|s| s.num_layers() != self.layers.len()) {
            return Err(Error::invalid(
                "states",
                format!(
                    "a state made for {} draft layers, this drafter has {}",
                    s.num_layers(),
                    self.layers.len()
                ),
            ));
        }
        if !crate::device::fast_on(&self.device) {
            // The device-generic path: the whole batch through each op at once.
            let ends: Vec<usize> = states.iter().map(|s| s.end()).collect();
            let ctx = self.gather_states(states)?;
            let (up, host) = self.upload_block(anchors, &ends, std::iter::empty())?;
            return self.block_hidden_batched(&ctx, &up, &host, b_n);
        }
        let ids = self.block_ids(anchors);
        let positions: Vec<usize> = states
            .iter()
            .flat_map(|s| s.end()..s.end() + q_len)
            .collect();
        let n = b_n * q_len;
        let ids = Tensor::from_vec(ids, n, &self.device)?;
        let mut x = self.embed.lookup(&ids, "input_ids")?;
        let (cos, sin) = self.rope.tables(&positions, &self.device)?;
        let eps = self.spec.shape.rms_norm_eps;
        let scale = 1.0 / (hd as f64).sqrt();
        let heads = Heads {
            heads,
            kv_heads: kvh,
            head_dim: hd,
            eps,
        };
        for (li, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x, heads, &self.rope, &cos, &sin, |q, k, v| {
                if let Some(out) = self.block_attention_host(states, li, (q, k, v), scale) {
                    return out;
                }
                let mut outs = Vec::with_capacity(b_n);
                for (b, s) in states.iter().enumerate() {
                    let kb = k.narrow(0, b * q_len, q_len)?.transpose(0, 1)?;
                    let vb = v.narrow(0, b * q_len, q_len)?.transpose(0, 1)?;
                    let (kb, vb) = match s.layer(li)? {
                        Some(c) => (Tensor::cat(&[&c.k, &kb], 1)?, Tensor::cat(&[&c.v, &vb], 1)?),
                        None => (kb.contiguous()?, vb.contiguous()?),
                    };
                    let qb = q.narrow(0, b * q_len, q_len)?;
                    outs.push(gqa_attention(&qb, &kb, &vb, scale)?);
                }
                Ok(Tensor::cat(&outs, 0)?)
            })?;
        }
        let x = rms_norm(&x, &self.norm, eps)?;
        let offset = q_len - k_n;
        Ok(x.reshape((b_n, q_len, self.spec.shape.hidden_size))?
            .narrow(1, offset, k_n)?
            .contiguous()?)
    }

    /// The block pass's attention of layer `li` where every state holds host panels with room
    /// for the block: each request's block keys and values written after its context as
    /// scratch, attended where they lie (`q: [B·Q, heads, hd]`, `k`, `v`: `[B·Q, kv_heads,
    /// hd]`; gives `[B·Q, heads·hd]`). `None` sends the call down the tensor path.
    fn block_attention_host(
        &self,
        states: &[&DraftState],
        li: usize,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        scale: f64,
    ) -> Option<Result<Tensor>> {
        if !states.iter().all(|s| s.is_host()) {
            return None;
        }
        let &[n, heads, hd] = q.dims() else {
            return None;
        };
        let q_len = n / states.len().max(1);
        let kv_row = k.dims().get(1..).map(|d| d.iter().product::<usize>())?;
        let out = crate::nn::fused::with_f32(q, |qs| {
            crate::nn::fused::with_f32(k, |ks| {
                crate::nn::fused::with_f32(v, |vs| {
                    let mut out = Vec::with_capacity(n * heads * hd);
                    for (b, s) in states.iter().enumerate() {
                        let (qr, kr) = (b * q_len * heads * hd, b * q_len * kv_row);
                        let rows = (
                            &qs[qr..qr + q_len * heads * hd],
                            &ks[kr..kr + q_len * kv_row],
                            &vs[kr..kr + q_len * kv_row],
                        );
                        match s.attend_block(li, rows, (q_len, heads), scale as f32)? {
                            Ok(o) => out.extend(o),
                            Err(e) => return Some(Err(e)),
                        }
                    }
                    Some(Ok(out))
                })
            })
        })????;
        Some(out.and_then(|o| Ok(Tensor::from_vec(o, (n, heads * hd), q.device())?)))
    }

    /// Base logits `[B, K, V_d]` = `lm_head(h)` (soft-capped when the config says so; the
    /// `logit_scale` is applied by the Markov kernel together with the bias).
    pub fn base_logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let (b, k, h) = hidden.dims3()?;
        let rows = hidden.reshape((b * k, h))?;
        let logits = match &self.head {
            Some(head) => head.forward(&rows)?,
            None => {
                let w = self.lm_head.as_ref().ok_or_else(|| Error::Internal {
                    message: "a drafter without a head keeps lm_head".into(),
                })?;
                matmul_t(&rows, w, None)?
            }
        };
        // A head borrowed from the target covers its `V_t` rows; a padded draft vocabulary's
        // further rows of `lm_head` are zeros, whose logits are 0.
        let pad = self.info.vocab.draft.saturating_sub(logits.dim(1)?);
        let logits = if pad > 0 {
            logits.pad_with_zeros(1, 0, pad)?
        } else {
            logits
        };
        let logits = logits.reshape((b, k, self.info.vocab.draft))?;
        Ok(match self.spec.final_logit_softcapping {
            Some(c) if c > 0.0 => ((logits / c)?.tanh()? * c)?,
            _ => logits,
        })
    }

    /// [`Drafter::propose_cached`] (`keep = false`) and [`Drafter::propose_for_verify`]
    /// (`keep = true`: on the device path the draft logits stay on the device, returned beside
    /// a proposal whose `draft_logits` is empty).
    pub(crate) fn propose_states_kept(
        &self,
        states: &[&DraftState],
        anchors: &[u32],
        opts: &ProposeOptions,
        keep: bool,
    ) -> Result<(Proposal, Option<Tensor>)> {
        let k_n = self.info().num_draft_tokens;
        if states.is_empty() && anchors.is_empty() {
            let empty = Proposal::empty(k_n, self.info.vocab.target, self.confidence.is_some());
            return Ok((empty, None));
        }
        kernel_path()?;
        let hidden = self.block_hidden(states, anchors)?;
        if let Some(heads) = &self.device_heads {
            return self.propose_on_device(heads, &hidden, anchors, opts, keep);
        }
        let mut base = host_f32(&self.base_logits(&hidden)?.to_dtype(DType::F32)?)?;
        let b_n = states.len();
        let dims = [b_n, k_n, self.info.vocab.draft];
        if let Some(bias) = &opts.logit_bias {
            super::bias::add_host(&mut base, dims, bias, &self.to_draft);
        }
        let r = self.spec.markov_rank;
        let w1 = Mat {
            data: Floats::F32(&self.markov_w1),
            dims: [self.info.vocab.input, r],
        };
        let w2 = Mat {
            data: Floats::F32(&self.markov_w2),
            dims: [self.info.vocab.draft, r],
        };
        let block_opts = self.block_options(opts);
        let block = match self.follow(opts) {
            Some(follow)
                if follow.pens.is_empty()
                    && crate::sampling::is_greedy_temperature(opts.temperature) =>
            {
                // Greedy guides alone: the block in one pass, refused rows drawn again there.
                let rows = Rows3 {
                    data: Floats::F32(&base),
                    dims,
                };
                let mut block = sample_block_slices(rows, w1, w2, anchors, &block_opts)?;
                if let Some(mut g) = Guided::new(follow.guides, b_n, false) {
                    guide_block(
                        &mut block,
                        &base,
                        dims,
                        (w1, w2),
                        anchors,
                        &block_opts,
                        &mut g,
                    )?;
                }
                block
            }
            Some(follow) => {
                sample_block_in_block(&mut base, dims, (w1, w2), anchors, &block_opts, &follow)?
            }
            None => sample_block_slices(
                Rows3 {
                    data: Floats::F32(&base),
                    dims,
                },
                w1,
                w2,
                anchors,
                &block_opts,
            )?,
        };
        let confidence = match &self.confidence {
            None => None,
            Some(head) => {
                let h = host_f32(&hidden)?;
                let with_markov = self.spec.confidence_head_with_markov && r > 0;
                Some(confidence_slices(
                    Rows3 {
                        data: Floats::F32(&h),
                        dims: [b_n, k_n, self.spec.shape.hidden_size],
                    },
                    with_markov.then_some(block.prev_embeddings.as_slice()),
                    Floats::F32(&head.weight),
                    &[head.weight.len()],
                    head.bias,
                    self.sts.as_ref(),
                )?)
            }
        };
        let proposal = Proposal {
            batch: b_n,
            slots: k_n,
            target_vocab: self.info.vocab.target,
            tokens: block.tokens,
            draft_logits: block.draft_logits,
            confidence,
        };
        Ok((proposal, None))
    }

    /// The end of [`Qwen3Drafter::propose_states_kept`] on the device-generic path: the
    /// sampling kernels' tensor fronts over the block hidden states `[B, K, H]`, base logits and
    /// the heads where they are (the drawn tokens and the confidences come back to the host;
    /// the draft logits too unless `keep`).
    pub(crate) fn propose_on_device(
        &self,
        heads: &DeviceHeads,
        hidden: &Tensor,
        anchors: &[u32],
        opts: &ProposeOptions,
        keep: bool,
    ) -> Result<(Proposal, Option<Tensor>)> {
        let (b_n, k_n, _) = hidden.dims3()?;
        let mut base = self.base_logits(hidden)?;
        if let Some(bias) = &opts.logit_bias {
            base = super::bias::add_tensor(&base, bias, &self.to_draft)?;
        }
        let block_opts = self.block_options(opts);
        let block = match self.follow(opts) {
            Some(follow) => sample_block_in_block_on_device(
                &base,
                (&heads.w1, &heads.w2),
                anchors,
                &block_opts,
                &follow,
            )?,
            None => crate::sampling::sample_block_on_device(
                &base,
                &heads.w1,
                &heads.w2,
                anchors,
                &block_opts,
            )?,
        };
        let confidence = match &heads.confidence {
            None => None,
            Some((weight, bias)) => {
                let r = self.spec.markov_rank;
                let prev = (self.spec.confidence_head_with_markov && r > 0)
                    .then_some(&block.prev_embeddings);
                let c = crate::sampling::confidence(
                    hidden,
                    prev,
                    weight,
                    Some(bias),
                    self.sts.as_ref(),
                )?;
                Some(host_f32(&c)?)
            }
        };
        let (draft_logits, kept) = if keep {
            (Vec::new(), Some(block.draft_logits))
        } else {
            (host_f32(&block.draft_logits)?, None)
        };
        let proposal = Proposal {
            batch: b_n,
            slots: k_n,
            target_vocab: self.info.vocab.target,
            tokens: block.tokens,
            draft_logits,
            confidence,
        };
        Ok((proposal, kept))
    }
}
