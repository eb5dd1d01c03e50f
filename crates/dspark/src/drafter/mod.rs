//! Drafters: the contract every drafter backend implements, and the Qwen3-shaped DSpark
//! drafter in candle.
//!
//! [`Drafter`] is the engine-side contract. A backend that leaves out a member does not compile:
//! block size, noise token, vocabulary sizes, the draft-to-target [`IdMap`] (identity included),
//! where embed and lm_head come from, target layers in both semantics, whether it samples from
//! the anchor, whether it has a confidence head, and the two ways to draft a block: stateless
//! [`Drafter::propose`] over a whole context, and the cached path
//! ([`Drafter::new_state`], [`Drafter::extend`], [`Drafter::propose_cached`],
//! [`DraftState::truncate`]) that a speculator uses so that each round costs one pass over the
//! block, not over the context.
//!
//! Submodules: [`cache`] ([`DraftState`]), [`qwen3`] ([`Qwen3Drafter`]: loading), `forward`
//! (the block pass over the cached context). The layers come from [`crate::nn`], shared with
//! [`crate::models::qwen3::Qwen3Target`].

mod batched;
mod bias;
pub mod cache;
mod cost;
mod follow;
mod forward;
pub mod guide;
mod in_block;
pub mod qwen3;
mod split;

use candle_core::{Device, Tensor};

pub use crate::nn::SharedWeights;
pub use cache::DraftState;
pub use follow::InBlockPenalty;
pub use guide::{BlockGuide, Guide};
pub use qwen3::{Qwen3Drafter, Qwen3DrafterBuilder};

use crate::checkpoint::WeightSource;
use crate::error::{Error, Result};
use crate::idmap::IdMap;
use crate::sampling::Seeds;
use crate::vocab::VocabSizes;

/// Sampling options of one drafting call.
#[derive(Debug, Clone, PartialEq)]
pub struct ProposeOptions {
    /// Draft temperature; `0` = greedy (argmax, ties → lowest id).
    pub temperature: f32,
    /// Random seeds: one for the call (row `b` draws from stream `(seed, b)`) or one per request.
    pub seeds: Seeds,
    /// Top-k candidate walk (`None` = dense): only each slot's base top-k get the Markov bias.
    pub top_k: Option<usize>,
    /// Per request (one list per row): amounts added to the base logits of these TARGET ids at
    /// every slot before the block is drawn (ids outside the draft vocabulary are skipped),
    /// so that drafts follow a penalized target (the engine passes each request's presence
    /// and frequency penalties and logit bias). The reported draft logits include them. A
    /// drafter may ignore them: verification is exact for any draft distribution it reports.
    pub logit_bias: Option<Vec<Vec<(u32, f32)>>>,
    /// Per request: presence and frequency penalties that also follow the drafts of this block
    /// (a token drafted at slot `k` is penalized at the later slots, as verification will score
    /// them), drawing the block slot by slot. A drafter may ignore them (as `logit_bias`).
    pub in_block: Option<Vec<InBlockPenalty>>,
    /// Per request: what its block may hold (a grammar's state). A greedy block is checked
    /// slot by slot and a refused slot drawn again among the allowed tokens; a sampled block
    /// draws every slot from the drafter's distribution restricted to the allowed tokens, and
    /// reports that. A drafter may ignore them (see [`guide`]).
    pub guides: Option<Vec<Option<Guide>>>,
}

impl Default for ProposeOptions {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            seeds: Seeds::Scalar(0),
            top_k: None,
            logit_bias: None,
            in_block: None,
            guides: None,
        }
    }
}

/// A drafted block for `B` requests of `K` tokens each.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    /// `B`.
    pub batch: usize,
    /// `K`: draft tokens per request.
    pub slots: usize,
    /// `V_t`.
    pub target_vocab: usize,
    /// `[B·K]` drafted TARGET ids, row-major.
    pub tokens: Vec<u32>,
    /// `[B·K·V_t]`: `softmax(row)` is exactly the distribution slot `k` was drawn from, in
    /// target space (`-inf` outside the draft's support; one-hot `0 / -inf` at `T = 0`).
    pub draft_logits: Vec<f32>,
    /// `[B·K]` confidences `sigmoid(w·[h_k ; W1[x_{k-1}]] + b)`, when the drafter has the head.
    pub confidence: Option<Vec<f32>>,
}

impl Proposal {
    /// An empty block (no requests).
    pub(crate) fn empty(slots: usize, target_vocab: usize, confidence: bool) -> Self {
        Self {
            batch: 0,
            slots,
            target_vocab,
            tokens: Vec::new(),
            draft_logits: Vec::new(),
            confidence: confidence.then(Vec::new),
        }
    }

    /// Tokens as a `[B, K]` `u32` tensor.
    pub fn tokens_tensor(&self, device: &Device) -> Result<Tensor> {
        Ok(Tensor::from_slice(
            &self.tokens,
            (self.batch, self.slots),
            device,
        )?)
    }

    /// Draft logits as a `[B, K, V_t]` `f32` tensor.
    pub fn draft_logits_tensor(&self, device: &Device) -> Result<Tensor> {
        Ok(Tensor::from_slice(
            &self.draft_logits,
            (self.batch, self.slots, self.target_vocab),
            device,
        )?)
    }

    /// Confidences as a `[B, K]` `f32` tensor, when present.
    pub fn confidence_tensor(&self, device: &Device) -> Result<Option<Tensor>> {
        match &self.confidence {
            None => Ok(None),
            Some(c) => Ok(Some(Tensor::from_slice(
                c,
                (self.batch, self.slots),
                device,
            )?)),
        }
    }
}

/// What a drafter is, fixed at load: its block, vocabulary, weight sources and the target
/// layers it reads. [`Drafter::info`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrafterInfo {
    /// Trained block width `K`: draft tokens per request and round.
    pub block_size: usize,
    /// `K`, the number of draft tokens one proposal holds (= `block_size` in both layouts;
    /// the 1+K layout feeds `K + 1` input slots).
    pub num_draft_tokens: usize,
    /// The noise (mask) token id filling the block after the anchor.
    pub noise_token: u32,
    /// `V_in`, `V_d`, `V_t`.
    pub vocab: VocabSizes,
    /// Whether `embed_tokens` is the drafter's own or the target's.
    pub embed_source: WeightSource,
    /// Whether `lm_head` is the drafter's own or the target's.
    pub lm_head_source: WeightSource,
    /// Feature layers in DeepSpec semantics: id `i` = output of target layer `i` (HF
    /// `hidden_states[i+1]`), `-1` = the embedding output.
    pub target_layer_ids: Vec<i64>,
    /// The same layers in capture semantics (input of layer `j` = `i + 1`).
    pub capture_layer_ids: Vec<usize>,
    /// `true`: slot `k` of `[anchor, M, …]` predicts position `n+k+1`; `false`: the 1+K
    /// layout (`[anchor, M×K]`, predictions read from slots `1..K`).
    pub sample_from_anchor: bool,
    /// Whether proposals carry confidences.
    pub has_confidence_head: bool,
    /// Width of one context feature row, `L·H_t`.
    pub context_width: usize,
}

/// The drafter contract. Every backend exposes all of it.
///
/// Positions: a context of `T` feature rows covers absolute positions `start .. start+T−1` and
/// the anchor (the last committed token) sits at `start+T`. Feature rows are the target's hidden
/// states at [`DrafterInfo::target_layer_ids`] concatenated along the last dimension
/// (`[.., L·H_t]`).
pub trait Drafter {
    /// One request's drafting context ([`DraftState`] for the candle drafter; an adapter over
    /// another runtime keeps its own).
    type State;
    /// What the drafter is: its block, vocabulary, weight sources and the target layers it
    /// reads ([`DrafterInfo`]).
    fn info(&self) -> &DrafterInfo;
    /// The draft-to-target id map (identity for full and padded vocabularies).
    fn id_map(&self) -> &IdMap;
    /// An empty per-request state.
    fn new_state(&self) -> Result<Self::State>;
    /// Append context features `[T_new, L·H_t]` at absolute positions `start_position ..` to
    /// `state`. Only new positions are computed: rows of positions the state already holds are
    /// skipped (roll back with [`DraftState::truncate`] to replace them); a gap is an error.
    fn extend(
        &self,
        state: &mut Self::State,
        features: &Tensor,
        start_position: usize,
    ) -> Result<()>;
    /// Roll `state` back to its first `len` context positions (`invalid-argument` when it
    /// holds fewer).
    fn truncate(&self, state: &mut Self::State, len: usize) -> Result<()>;
    /// One past the last context position `state` holds: where its next anchor sits.
    fn state_end(&self, state: &Self::State) -> usize;
    /// Draft one block per state: request `b`'s anchor `anchors[b]` sits at `states[b].end()`.
    /// One pass over the block; the states are not modified.
    fn propose_cached(
        &self,
        states: &[&Self::State],
        anchors: &[u32],
        opts: &ProposeOptions,
    ) -> Result<Proposal>;
    /// [`Drafter::propose_cached`] for a consumer that verifies next (the engine's round): a
    /// drafter whose draft logits live on a device may leave them there, returned as
    /// `Some([B, K, V_t])` beside a proposal whose `draft_logits` is then empty, so that
    /// verification reads them in place. The default returns the host proposal and `None`.
    fn propose_for_verify(
        &self,
        states: &[&Self::State],
        anchors: &[u32],
        opts: &ProposeOptions,
    ) -> Result<(Proposal, Option<Tensor>)> {
        Ok((self.propose_cached(states, anchors, opts)?, None))
    }
    /// What one block pass costs by the drafter's shape, per row of the block (a proposal for
    /// `B` requests passes `B · block_size` rows): the scheduling policy's price of proposing
    /// before it has timed a proposal. `None` (the default): unknown, and the policy drafts
    /// to time one.
    fn propose_cost(&self) -> Result<Option<crate::models::ForwardCost>> {
        Ok(None)
    }
    /// Stateless drafting: `context` is `[B, T, L·H_t]`, request `b`'s context covers positions
    /// `start_positions[b] ..` (one value broadcasts) and its anchor sits right after it. A
    /// state per request, extended and proposed from ([`Drafter::propose_cached`]).
    fn propose(
        &self,
        context: &Tensor,
        anchors: &[u32],
        start_positions: &[usize],
        opts: &ProposeOptions,
    ) -> Result<Proposal> {
        propose_through_states(self, context, anchors, start_positions, opts)
    }
}

/// The default [`Drafter::propose`]: a state per request, extended and proposed from.
pub(crate) fn propose_through_states<D: Drafter + ?Sized>(
    d: &D,
    context: &Tensor,
    anchors: &[u32],
    start_positions: &[usize],
    opts: &ProposeOptions,
) -> Result<Proposal> {
    let (b, _t, _w) = check_stateless(context, start_positions)?;
    let mut states = Vec::with_capacity(b);
    for i in 0..b {
        let mut state = d.new_state()?;
        let start = start_positions[if start_positions.len() == 1 { 0 } else { i }];
        d.extend(&mut state, &context.get(i)?, start)?;
        states.push(state);
    }
    let refs: Vec<&D::State> = states.iter().collect();
    d.propose_cached(&refs, anchors, opts)
}

/// The shape checks of a stateless [`Drafter::propose`]: `context` is `[B, T, L·H_t]` and
/// `start_positions` holds 1 or `B` values. Returns `(B, T, width)`.
pub(crate) fn check_stateless(
    context: &Tensor,
    start_positions: &[usize],
) -> Result<(usize, usize, usize)> {
    let (b, t, w) = context.dims3().map_err(|_| {
        Error::bad_shape(
            "context",
            format!("shape {:?}, expected [B, T, L·H_t]", context.dims()),
        )
    })?;
    if start_positions.len() != 1 && start_positions.len() != b {
        return Err(Error::bad_shape(
            "start_positions",
            format!(
                "{} values for a batch of {b} (give 1 or B)",
                start_positions.len()
            ),
        ));
    }
    Ok((b, t, w))
}

impl<D: Drafter + ?Sized> Drafter for std::sync::Arc<D> {
    type State = D::State;

    fn info(&self) -> &DrafterInfo {
        (**self).info()
    }
    fn id_map(&self) -> &IdMap {
        (**self).id_map()
    }
    fn new_state(&self) -> Result<Self::State> {
        (**self).new_state()
    }
    fn extend(&self, state: &mut Self::State, features: &Tensor, start: usize) -> Result<()> {
        (**self).extend(state, features, start)
    }
    fn truncate(&self, state: &mut Self::State, len: usize) -> Result<()> {
        (**self).truncate(state, len)
    }
    fn state_end(&self, state: &Self::State) -> usize {
        (**self).state_end(state)
    }
    fn propose_cached(
        &self,
        states: &[&Self::State],
        anchors: &[u32],
        opts: &ProposeOptions,
    ) -> Result<Proposal> {
        (**self).propose_cached(states, anchors, opts)
    }
    fn propose_for_verify(
        &self,
        states: &[&Self::State],
        anchors: &[u32],
        opts: &ProposeOptions,
    ) -> Result<(Proposal, Option<Tensor>)> {
        (**self).propose_for_verify(states, anchors, opts)
    }
    fn propose(
        &self,
        context: &Tensor,
        anchors: &[u32],
        start_positions: &[usize],
        opts: &ProposeOptions,
    ) -> Result<Proposal> {
        (**self).propose(context, anchors, start_positions, opts)
    }
    fn propose_cost(&self) -> Result<Option<crate::models::ForwardCost>> {
        (**self).propose_cost()
    }
}
