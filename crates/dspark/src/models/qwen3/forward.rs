//! The ragged (packed) forward of [`Qwen3Target`].
//!
//! The new tokens of every request are gathered into one `[N, H]` matrix (`N` = the sum of
//! `num_tokens`, not `B·width`), so every linear map, norm and MLP costs the total number of
//! new tokens (as in vLLM); attention runs per request against its own cache, causal within
//! the new tokens (on the device-generic path all requests in one batched attention per
//! layer: `device_rows.rs`). The lm_head (the largest matmul) runs only over the rows asked for;
//! logits and captured hidden states are then scattered into `[B, S, ·]` with zeros on
//! padding.

use candle_core::{DType, Tensor};

use super::cache::Qwen3Cache;
use super::device_rows::DeviceRows;
use super::model::Qwen3Target;
use crate::error::{Error, Result};
use crate::limits::{MAX_POSITION, output_elements};
use crate::models::{LogitRows, TargetInput, TargetOutput};
use crate::nn::{causal_gqa_attention_kt, matmul_t, rms_norm};

/// Where each request's new tokens sit in the packed batch.
struct Packed {
    /// `[N]` token ids.
    ids: Vec<u32>,
    /// `[N]` absolute positions.
    positions: Vec<usize>,
    /// Per request: `(offset in the packed batch, new tokens)`.
    rows: Vec<(usize, usize)>,
}

impl Qwen3Target {
    /// Check everything about a forward before any work, and pack its tokens.
    fn pack(
        &self,
        cache: &Qwen3Cache,
        input: &TargetInput<'_>,
        capture: &[usize],
    ) -> Result<Packed> {
        let (b_n, width) = (input.batch(), input.width);
        let c = &self.config;
        if !cache.fits(
            c.shape.num_hidden_layers,
            c.shape.num_key_value_heads,
            c.shape.head_dim,
            &self.device,
        ) {
            return Err(Error::invalid(
                "cache",
                "made by another model (layer count, kv heads, head_dim or device differ)",
            ));
        }
        if cache.batch() != b_n {
            return Err(Error::bad_shape(
                "num_tokens",
                format!("{b_n} rows for a cache of {} requests", cache.batch()),
            ));
        }
        if b_n.checked_mul(width) != Some(input.tokens.len()) {
            return Err(Error::bad_shape(
                "tokens",
                format!("{} ids for {b_n} rows of width {width}", input.tokens.len()),
            ));
        }
        if let Some(&bad) = capture.iter().find(|&&l| l >= c.shape.num_hidden_layers) {
            return Err(Error::TargetMismatch {
                message: format!(
                    "capture layer id {bad} is outside 0..{} (the target's decoder layers)",
                    c.shape.num_hidden_layers
                ),
            });
        }
        input.check()?;
        let out_rows = input.logits.rows(width);
        let u = |x: usize| x as u64;
        output_elements("logits", &[u(b_n), u(out_rows), u(c.shape.vocab_size)])?;
        let lh = capture.len().saturating_mul(c.shape.hidden_size);
        output_elements("hidden_states", &[u(b_n), u(width), u(lh)])?;
        let mut packed = Packed {
            ids: Vec::new(),
            positions: Vec::new(),
            rows: Vec::with_capacity(b_n),
        };
        for (b, &n) in input.num_tokens.iter().enumerate() {
            if n > width {
                return Err(Error::invalid(
                    "num_tokens",
                    format!("row {b} has {n} new tokens, more than the width {width}"),
                ));
            }
            let row = &input.tokens[b * width..b * width + n];
            if let Some(&id) = row.iter().find(|&&id| id as usize >= c.shape.vocab_size) {
                return Err(Error::TokenOutOfRange {
                    name: "tokens".into(),
                    id: i64::from(id),
                    vocab_size: c.shape.vocab_size,
                });
            }
            let start = cache.lengths()[b];
            let end = start.saturating_add(n);
            if end as u64 > MAX_POSITION {
                return Err(Error::too_large("positions", end, MAX_POSITION, ""));
            }
            packed.rows.push((packed.ids.len(), n));
            packed.ids.extend_from_slice(row);
            packed.positions.extend(start..end);
        }
        Ok(packed)
    }

    /// [`crate::models::TargetModel::forward`]. On the host fast path the forward runs on
    /// a pool worker ([`crate::threads::on_pool`]), so that its large products split their
    /// weights over the pool, inside a speculative round too (a step's time is the time to
    /// read the weights, and one core alone does not reach the read bandwidth).
    pub(crate) fn forward_packed(
        &self,
        cache: &mut Qwen3Cache,
        input: &TargetInput<'_>,
        capture: &[usize],
    ) -> Result<TargetOutput> {
        if crate::device::fast_on(&self.device) {
            crate::threads::on_pool(|| self.forward_here(cache, input, capture))
        } else {
            self.forward_here(cache, input, capture)
        }
    }

    /// [`Self::forward_packed`] on the calling thread.
    fn forward_here(
        &self,
        cache: &mut Qwen3Cache,
        input: &TargetInput<'_>,
        capture: &[usize],
    ) -> Result<TargetOutput> {
        let mut p = self.pack(cache, input, capture)?;
        let (b_n, width, n) = (input.batch(), input.width, p.ids.len());
        let (h, v) = (self.config.shape.hidden_size, self.config.shape.vocab_size);
        let out_rows = input.logits.rows(width);
        if n == 0 {
            return Ok(TargetOutput {
                logits: Tensor::zeros((b_n, out_rows, v), DType::F32, &self.device)?,
                hidden_states: Tensor::zeros(
                    (b_n, width, capture.len() * h),
                    DType::F32,
                    &self.device,
                )?,
            });
        }
        for (b, &(_, m)) in p.rows.iter().enumerate() {
            if m > 0 {
                cache.reserve(b, cache.lengths()[b] + m)?;
            }
        }
        // The device-generic path: one upload, the mask built once, one attention per layer.
        let device_rows = if crate::device::fast_on(&self.device) {
            None
        } else {
            Some(DeviceRows::new(
                &p.ids,
                &p.positions,
                &p.rows,
                cache.lengths(),
                &self.key_index,
                &self.device,
            )?)
        };
        let (ids, (cos, sin)) = match &device_rows {
            Some(d) => (
                d.ids.clone(),
                self.rope
                    .tables_at(&self.rope_cache, &d.positions, &p.positions)?,
            ),
            None => (
                Tensor::from_vec(std::mem::take(&mut p.ids), n, &self.device)?,
                self.rope.tables(&p.positions, &self.device)?,
            ),
        };
        let mut x = self.embed.lookup(&ids, "input_ids")?;
        let heads = self.heads();
        let scale = 1.0 / (heads.head_dim as f64).sqrt();
        let mut captured: Vec<Option<Tensor>> = vec![None; self.layers.len()];
        for (li, layer) in self.layers.iter().enumerate() {
            if capture.contains(&li) {
                captured[li] = Some(x.clone());
            }
            let cache = &mut *cache;
            x = layer.forward(&x, heads, &self.rope, &cos, &sin, |q, k, v| {
                if let Some(d) = &device_rows {
                    return d.attend(cache, li, (q, k, v), scale);
                }
                if let Some(out) = cache.attend_host(li, &p.rows, (q, k, v), scale) {
                    return out;
                }
                let mut outs = Vec::with_capacity(b_n);
                for (b, &(off, m)) in p.rows.iter().enumerate() {
                    if m == 0 {
                        continue;
                    }
                    let live = cache.write(b, li, &k.narrow(0, off, m)?, &v.narrow(0, off, m)?)?;
                    outs.push(causal_gqa_attention_kt(
                        &q.narrow(0, off, m)?,
                        &live.kt,
                        &live.v,
                        live.len,
                        scale,
                    )?);
                }
                Ok(match outs.len() {
                    1 => outs.swap_remove(0),
                    _ => Tensor::cat(&outs, 0)?,
                })
            })?;
        }
        let x = rms_norm(&x, &self.norm, heads.eps)?;
        // Logits: only the rows asked for; `slots[i]` = the packed row output slot `i` shows.
        let (selected, slots) = match input.logits {
            LogitRows::All => (x, all_slots(&p.rows, width)),
            LogitRows::Last => {
                let last: Vec<u32> = p
                    .rows
                    .iter()
                    .filter(|&&(_, m)| m > 0)
                    .map(|&(off, m)| (off + m - 1) as u32)
                    .collect();
                let mut next = 0;
                let slots = p
                    .rows
                    .iter()
                    .map(|&(_, m)| {
                        (m > 0).then(|| {
                            next += 1;
                            next - 1
                        })
                    })
                    .collect();
                let sel = if last.len() == n {
                    x
                } else {
                    let idx = Tensor::from_vec(last, n_rows(&p.rows), &self.device)?;
                    x.index_select(&idx, 0)?
                };
                (sel, slots)
            }
            LogitRows::Tail(_) => {
                // Each row's last positions asked for, in order; `sel` the packed rows read.
                let mut sel: Vec<u32> = Vec::new();
                let mut slots = Vec::with_capacity(b_n * out_rows);
                for (b, &(off, m)) in p.rows.iter().enumerate() {
                    for j in input.logits.positions(b, m, width) {
                        slots.push(j.map(|j| {
                            sel.push((off + j) as u32);
                            sel.len() - 1
                        }));
                    }
                }
                if sel.is_empty() {
                    let logits = Tensor::zeros((b_n, out_rows, v), DType::F32, &self.device)?;
                    return self.finish_forward(cache, &p, logits, &captured, capture, width);
                }
                let in_order =
                    sel.len() == n && sel.iter().enumerate().all(|(i, &r)| r as usize == i);
                let count = sel.len();
                let x = if in_order {
                    x
                } else {
                    x.index_select(&Tensor::from_vec(sel, count, &self.device)?, 0)?
                };
                (x, slots)
            }
        };
        let logits = match &self.head {
            Some(head) => head.forward(&selected)?,
            None => {
                let w = self
                    .lm_head_logical
                    .as_ref()
                    .ok_or_else(|| Error::Internal {
                        message: "a target without a packed head keeps its dense rows".into(),
                    })?;
                matmul_t(&selected, w, None)?
            }
        };
        let logits = scatter(&logits, &slots, (b_n, out_rows, v))?;
        self.finish_forward(cache, &p, logits, &captured, capture, width)
    }

    /// The captured hidden states scattered to `[B, S, L·H]`, the cache advanced past the
    /// forward's tokens, and the output.
    fn finish_forward(
        &self,
        cache: &mut Qwen3Cache,
        p: &Packed,
        logits: Tensor,
        captured: &[Option<Tensor>],
        capture: &[usize],
        width: usize,
    ) -> Result<TargetOutput> {
        let (b_n, h) = (p.rows.len(), self.config.shape.hidden_size);
        let hidden = if capture.is_empty() {
            Tensor::zeros((b_n, width, 0), DType::F32, &self.device)?
        } else {
            let parts = capture
                .iter()
                .map(|&l| {
                    captured[l]
                        .clone()
                        .ok_or_else(|| Error::invalid("capture_layer_ids", "layer not captured"))
                })
                .collect::<Result<Vec<_>>>()?;
            let cat = if parts.len() == 1 {
                parts[0].clone()
            } else {
                Tensor::cat(&parts, 1)?
            };
            scatter(
                &cat,
                &all_slots(&p.rows, width),
                (b_n, width, capture.len() * h),
            )?
        };
        for (b, &(_, m)) in p.rows.iter().enumerate() {
            cache.advance(b, m);
        }
        Ok(TargetOutput {
            logits,
            hidden_states: hidden,
        })
    }
}

/// Number of requests with new tokens.
fn n_rows(rows: &[(usize, usize)]) -> usize {
    rows.iter().filter(|&&(_, m)| m > 0).count()
}

/// For every `[B, width]` slot, the packed row it shows (`None`: padding).
fn all_slots(rows: &[(usize, usize)], width: usize) -> Vec<Option<usize>> {
    rows.iter()
        .flat_map(|&(off, m)| (0..width).map(move |j| (j < m).then_some(off + j)))
        .collect()
}

/// `packed: [M, W]` placed at `slots` (one per output row, row-major over `(B, S)`) of a
/// `[B, S, W]` output, zeros where a slot is `None`. No copy when the slots are exactly the
/// packed rows in order.
fn scatter(
    packed: &Tensor,
    slots: &[Option<usize>],
    shape: (usize, usize, usize),
) -> Result<Tensor> {
    let m = packed.dims().first().copied().unwrap_or(0);
    let identity = slots.len() == m && slots.iter().enumerate().all(|(i, s)| *s == Some(i));
    if identity {
        return Ok(packed.reshape(shape)?);
    }
    let zero = Tensor::zeros((1, shape.2), packed.dtype(), packed.device())?;
    let table = Tensor::cat(&[packed, &zero], 0)?;
    let idx: Vec<u32> = slots.iter().map(|s| s.unwrap_or(m) as u32).collect();
    let idx = Tensor::from_vec(idx, slots.len(), packed.device())?;
    Ok(table.index_select(&idx, 0)?.reshape(shape)?)
}
