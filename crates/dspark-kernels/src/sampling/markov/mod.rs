//! The sequential Markov block sampler.
//!
//! Slot `k`: `logits = scale·(base_k + W2·W1[x_{k-1}])` in draft space (`x_0` = anchor, `W1`
//! indexed by the previous token's TARGET id), padded columns `[V_t, V_d)` masked, then greedy
//! argmax (`T = 0`, ties → lowest id) or one inverse-CDF draw at temperature `T`; the draft id is
//! mapped to a target id and the next slot conditions on it. The exact distribution of each slot
//! is recorded in target space.
//!
//! Cost: per slot, `W2` is read once for the whole batch (a `[V_d, r] × [r, B]` product split over
//! column blocks across threads, see `cpu/dots.rs`); each column block is biased straight into its
//! destination and its statistics (max, argmax, sum-exp) are taken while it is hot, so a
//! sampled row is only touched again in the one block the draw lands in.
//!
//! `mod.rs` holds the options, the validation every path shares and the entry points;
//! `cpu.rs` is the host slice sampler (the reference), `device.rs` the device-generic tensor
//! sampler, `bias_op.rs` the Markov bias as a candle custom op (CPU and CUDA bodies).

mod bias_op;
mod cpu;
mod device;

pub use bias_op::{MarkovBias, markov_bias};
pub use device::DeviceBlock;

use candle_core::{Device, Tensor};

use super::args::{dims, ids};
use super::transfer::{self, check_float};
use crate::device::{KernelPath, kernel_path, same_device, use_fused, use_tensor_path};
use crate::error::{Error, Result};
use crate::idmap::IdMap;
use crate::limits::output_elements;
use crate::view::{Floats, Mat, Rows3, Seeds, with_floats};

/// Options of [`sample_block_slices`].
#[derive(Debug, Clone)]
pub struct BlockOptions<'a> {
    /// Draft temperature; `0` = greedy. Finite and `>= 0`.
    pub temperature: f32,
    /// Random seeds (see [`Seeds`]).
    pub seeds: Seeds,
    /// The drafter's draft-to-target id map (`target_vocab()` is `V_t`).
    pub id_map: &'a IdMap,
    /// Top-k candidate walk: only the base top-k of each slot get the Markov bias, every other
    /// column is `-inf` (`None` = dense; `Some(0)` is an error).
    pub top_k: Option<usize>,
    /// Multiplies base logits and bias (`1.0` when the model has none). Finite and `> 0`.
    pub logit_scale: f32,
}

impl BlockOptions<'_> {
    /// Whether the draft is greedy (`T` below [`super::GREEDY_BELOW`], or `logit_scale / T`
    /// overflowing: the distribution is then the argmax) and the factor every biased logit is
    /// multiplied by.
    pub(crate) fn draft_mult(&self) -> (bool, f32) {
        let greedy = super::is_greedy_temperature(self.temperature)
            || !(self.logit_scale / self.temperature).is_finite();
        let mult = if greedy {
            self.logit_scale
        } else {
            self.logit_scale / self.temperature
        };
        (greedy, mult)
    }
}

/// A drafted block.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftBlock {
    /// `B`.
    pub batch: usize,
    /// `K`.
    pub slots: usize,
    /// `V_t`.
    pub target_vocab: usize,
    /// Markov rank `r`.
    pub rank: usize,
    /// `[B·K]` drafted TARGET ids.
    pub tokens: Vec<u32>,
    /// `[B·K·V_t]`: `softmax(row)` is exactly the distribution slot `k` was drawn from (after bias,
    /// mask, temperature, top-k); `-inf` outside the draft's support; at `T = 0`, `0.0` at the
    /// argmax and `-inf` elsewhere.
    pub draft_logits: Vec<f32>,
    /// `[B·K·r]`: `W1[x_{k-1}]` in f32 (`x_0` = anchor), for the confidence head.
    pub prev_embeddings: Vec<f32>,
}

/// Draw a block of `K` tokens per request.
///
/// `base` is `[B, K, V_d]`, `w1` is `[V_in, r]` (rows indexed by target id), `w2` is `[V_d, r]`,
/// `anchors` holds `B` target ids `< V_in`.
pub fn sample_block_slices(
    base: Rows3<'_>,
    w1: Mat<'_>,
    w2: Mat<'_>,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<DraftBlock> {
    let on = match kernel_path()? {
        KernelPath::Fast => None,
        KernelPath::Tensor => Some(Device::Cpu),
        KernelPath::Fused => return sample_block_slices_fused(base, w1, w2, anchors, opts),
    };
    sample_block_slices_on(on.as_ref(), base, w1, w2, anchors, opts)
}

/// [`sample_block_slices`] by the model of the fused kernels ([`crate::sampling::fused`]),
/// whatever [`crate::device::KERNEL_PATH_ENV`] says: the same validation and errors, the same
/// greedy drafts but where float rounding of the bias moves an argmax, sampled drafts equal
/// for the same seeds but where summation order moves a boundary. Shapes beyond the fused
/// kernels' limits (a rank over 512) take the tensor path.
pub fn sample_block_slices_fused(
    base: Rows3<'_>,
    w1: Mat<'_>,
    w2: Mat<'_>,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<DraftBlock> {
    let g = validate(&base, &w1, &w2, anchors, opts)?;
    if !super::fused::fits_block(g.rank, g.valid) {
        return sample_block_slices_on(Some(&Device::Cpu), base, w1, w2, anchors, opts);
    }
    let streams = opts.seeds.streams(g.batch, "seeds")?;
    if g.batch == 0 || g.slots == 0 {
        return cpu::run(&g, &streams, base, w1, w2, anchors, opts);
    }
    super::fused::sample_block_host(&g, &streams, base, w1, w2, anchors, opts)
}

/// [`sample_block_slices`] on an explicit kernel path: `None` runs the host slice kernel
/// (whatever [`crate::device::KERNEL_PATH_ENV`] says), `Some(device)` the device-generic tensor
/// kernel on `device` (the inputs are uploaded there). Validation and results are the same on
/// both.
pub fn sample_block_slices_on(
    device: Option<&Device>,
    base: Rows3<'_>,
    w1: Mat<'_>,
    w2: Mat<'_>,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<DraftBlock> {
    let g = validate(&base, &w1, &w2, anchors, opts)?;
    let streams = opts.seeds.streams(g.batch, "seeds")?;
    // An empty block has nothing to upload (its dims may not even form a tensor shape).
    if let Some(dev) = device.filter(|_| g.batch > 0 && g.slots > 0) {
        let up = |f: Floats<'_>, dims: &[usize]| transfer::upload(f, dims, dev);
        let (b, m1, m2) = (
            up(base.data, &base.dims)?,
            up(w1.data, &w1.dims)?,
            up(w2.data, &w2.dims)?,
        );
        let out = device::sample_block_tensors(&g, &streams, &b, &m1, &m2, anchors, opts)?;
        return out.to_host();
    }
    cpu::run(&g, &streams, base, w1, w2, anchors, opts)
}

/// Tensor front of [`sample_block_slices`]: `base` `[B, K, V_d]`, `w1` `[V_in, r]`, `w2`
/// `[V_d, r]` (f32/f16/bf16), `anchors` `[B]` integer target ids.
pub fn sample_block(
    base: &Tensor,
    w1: &Tensor,
    w2: &Tensor,
    anchors: &Tensor,
    opts: &BlockOptions<'_>,
) -> Result<DraftBlock> {
    let bd = dims::<3>(base, "base_logits", "[B, K, V_d]")?;
    let d1 = dims::<2>(w1, "markov_w1", "[V_in, r]")?;
    let d2 = dims::<2>(w2, "markov_w2", "[V_d, r]")?;
    let a = ids(anchors, "anchors")?;
    dims::<1>(anchors, "anchors", "[B]")?;
    let a: Vec<u32> = a
        .iter()
        .map(|&x| {
            u32::try_from(x).map_err(|_| Error::TokenOutOfRange {
                name: "anchors".into(),
                id: x,
                vocab_size: d1[0],
            })
        })
        .collect::<Result<_>>()?;
    if use_tensor_path(base.device())? {
        return block_on_device(base, w1, w2, &a, opts)?.to_host();
    }
    with_floats(base, "base_logits", |b| {
        with_floats(w1, "markov_w1", |m1| {
            with_floats(w2, "markov_w2", |m2| {
                sample_block_slices(
                    Rows3 { data: b, dims: bd },
                    Mat { data: m1, dims: d1 },
                    Mat { data: m2, dims: d2 },
                    &a,
                    opts,
                )
            })
        })
    })
}

fn block_on_device(
    base: &Tensor,
    w1: &Tensor,
    w2: &Tensor,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<DeviceBlock> {
    let bd = dims::<3>(base, "base_logits", "[B, K, V_d]")?;
    let d1 = dims::<2>(w1, "markov_w1", "[V_in, r]")?;
    let d2 = dims::<2>(w2, "markov_w2", "[V_d, r]")?;
    let dev = base.device();
    same_device(dev, &[("markov_w1", w1), ("markov_w2", w2)])?;
    check_float(base, "base_logits")?;
    check_float(w1, "markov_w1")?;
    check_float(w2, "markov_w2")?;
    let g = validate_dims(bd, d1, d2, anchors, opts)?;
    let streams = opts.seeds.streams(g.batch, "seeds")?;
    let nonempty = g.batch > 0 && g.slots > 0;
    if nonempty && use_fused(dev)? && super::fused::fits_block(g.rank, g.valid) {
        #[cfg(feature = "cuda")]
        if dev.is_cuda() {
            return super::fused::sample_block_cuda(&g, &streams, base, w1, w2, anchors, opts);
        }
        if dev.is_cpu() {
            let block = with_floats(base, "base_logits", |b| {
                with_floats(w1, "markov_w1", |m1| {
                    with_floats(w2, "markov_w2", |m2| {
                        super::fused::sample_block_host(
                            &g,
                            &streams,
                            Rows3 { data: b, dims: bd },
                            Mat { data: m1, dims: d1 },
                            Mat { data: m2, dims: d2 },
                            anchors,
                            opts,
                        )
                    })
                })
            })?;
            return DeviceBlock::from_host(block, dev);
        }
    }
    device::sample_block_tensors(&g, &streams, base, w1, w2, anchors, opts)
}

/// [`sample_block`] on the device-generic path whatever the device, with the `[B, K, V_t]`
/// draft logits and the embeddings left on `base`'s device (only the tokens come back):
/// `anchors` are `B` target ids.
pub fn sample_block_on_device(
    base: &Tensor,
    w1: &Tensor,
    w2: &Tensor,
    anchors: &[u32],
    opts: &BlockOptions<'_>,
) -> Result<DeviceBlock> {
    block_on_device(base, w1, w2, anchors, opts)
}

/// Validated geometry.
pub(crate) struct Geometry {
    /// `B`.
    pub batch: usize,
    /// `K`.
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
    // Outputs first (a zero-size input can carry one huge dimension): `[B, K, V_t]` draft
    // logits (`V_t` may exceed `V_d` with a table) and `[B, K, r]` embeddings, sized with
    // checked arithmetic before anything else is looked at or allocated.
    let target_vocab = opts.id_map.target_vocab();
    let (b64, k64) = (batch as u64, slots as u64);
    output_elements("target_vocab_size", &[b64, k64, target_vocab as u64])?;
    output_elements("markov_w1", &[b64, k64, rank as u64])?;
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
    Ok(Geometry {
        batch,
        slots,
        target_vocab,
        valid,
        rank,
    })
}
