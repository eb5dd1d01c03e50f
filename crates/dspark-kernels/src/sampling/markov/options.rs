//! A block draw's options, inputs and outcome, and the validation every path shares:
//! [`HostInputs::validate`] (slices) and [`validate_dims`] (shapes only, for the tensor path)
//! turn a call into its [`Geometry`]. The samplers (host, tensor path, fused launches) take it;
//! none of them is imported here.

use candle_core::Tensor;

use crate::error::{Error, Result};
use crate::idmap::IdMap;
use crate::limits::output_elements;
use crate::view::{Mat, Rows3, Seeds};

/// Options of a block draw (`sample_block_slices`, `sample_block`).
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
    /// Whether the draft is greedy (`T` below [`GREEDY_BELOW`](super::super::GREEDY_BELOW), or `logit_scale / T`
    /// overflowing: the distribution is then the argmax) and the factor every biased logit is
    /// multiplied by.
    pub(crate) fn draft_mult(&self) -> (bool, f32) {
        let greedy = super::super::is_greedy_temperature(self.temperature)
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

/// A block struct (`DraftBlock`, `DeviceBlock`: the same fields over host vectors or tensors)
/// of geometry `$g` with these outputs.
macro_rules! block_struct {
    ($ty:ident, $g:expr, $tokens:expr, $logits:expr, $embeddings:expr) => {
        $ty {
            batch: $g.batch,
            slots: $g.slots,
            target_vocab: $g.target_vocab,
            rank: $g.rank,
            tokens: $tokens,
            draft_logits: $logits,
            prev_embeddings: $embeddings,
        }
    };
}
pub(crate) use block_struct;

impl DraftBlock {
    /// A block of geometry `g` with these outputs.
    pub(crate) fn new(
        g: &Geometry,
        tokens: Vec<u32>,
        draft_logits: Vec<f32>,
        prev_embeddings: Vec<f32>,
    ) -> Self {
        block_struct!(DraftBlock, g, tokens, draft_logits, prev_embeddings)
    }
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

/// One block call's inputs: `base` `[B, K, V_d]`, `w1` `[V_in, r]` (rows indexed by target
/// id), `w2` `[V_d, r]`, the `B` anchor target ids and the options; the matrices as host views
/// ([`HostInputs`]) or tensors ([`TensorInputs`]).
#[derive(Clone, Copy)]
pub(crate) struct Inputs<'a, B, M> {
    pub base: B,
    pub w1: M,
    pub w2: M,
    pub anchors: &'a [u32],
    pub opts: &'a BlockOptions<'a>,
}

/// A call's inputs over host memory.
pub(crate) type HostInputs<'a> = Inputs<'a, Rows3<'a>, Mat<'a>>;

/// A call's inputs as tensors (on one device, any of f32/f16/bf16).
pub(crate) type TensorInputs<'a> = Inputs<'a, &'a Tensor, &'a Tensor>;

impl<'a, B, M> Inputs<'a, B, M> {
    /// A call's inputs.
    pub(crate) fn new(
        base: B,
        w1: M,
        w2: M,
        anchors: &'a [u32],
        opts: &'a BlockOptions<'a>,
    ) -> Self {
        Inputs {
            base,
            w1,
            w2,
            anchors,
            opts,
        }
    }

    /// The same anchors and options over other matrices.
    pub(crate) fn with<B2, M2>(&self, base: B2, w1: M2, w2: M2) -> Inputs<'a, B2, M2> {
        Inputs::new(base, w1, w2, self.anchors, self.opts)
    }
}

impl HostInputs<'_> {
    /// Check the views and then the shapes and options ([`validate_dims`]).
    pub(crate) fn validate(&self) -> Result<Geometry> {
        self.base.check("base_logits")?;
        self.w1.check("markov_w1")?;
        self.w2.check("markov_w2")?;
        validate_dims(
            self.base.dims,
            self.w1.dims,
            self.w2.dims,
            self.anchors,
            self.opts,
        )
    }
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
