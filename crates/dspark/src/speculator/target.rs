//! The target side of the loop: [`TargetModel`], what a forward takes ([`TargetInput`]) and
//! what it gives back ([`TargetOutput`]).
//!
//! Capture semantics (the one resolver in [`crate::config`]): capture id `c` is the input of
//! decoder layer `c` (HF `hidden_states[c]`; `0` = the embedding output). Only
//! `0..num_hidden_layers` are pre-norm layer outputs a drafter may fuse.

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};

/// Which positions of a forward need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// Every new position: logits `[B, S, V_t]`.
    All,
    /// The last new position of each row only: logits `[B, 1, V_t]` (a prefill needs no more).
    /// Rows with no new token get an arbitrary (finite) row.
    Last,
}

/// The new tokens of one forward over a batch: row `b` appends
/// `tokens[b·width .. b·width + num_tokens[b]]` at positions `len_b ..` (its cached length on).
#[derive(Debug, Clone, Copy)]
pub struct TargetInput<'a> {
    /// `[B, width]` token ids, row-major; entries past `num_tokens[b]` are padding.
    pub tokens: &'a [u32],
    /// `S`: the padded row width.
    pub width: usize,
    /// `[B]`: new tokens per row, each `<= width` (`0`: the row sits this forward out).
    pub num_tokens: &'a [usize],
    /// Which positions need logits.
    pub logits: LogitRows,
}

impl TargetInput<'_> {
    /// `B`.
    pub fn batch(&self) -> usize {
        self.num_tokens.len()
    }
}

/// What a forward returns.
#[derive(Debug, Clone)]
pub struct TargetOutput {
    /// `[B, S, V_t]` (or `[B, 1, V_t]` for [`LogitRows::Last`]), any float dtype, on the
    /// target's device. Only the logical vocabulary `V_t` (padded rows dropped).
    pub logits: Tensor,
    /// `[B, S, L·H]`: the hidden states at the requested capture ids, concatenated on the last
    /// dimension in the order given. Rows past `num_tokens[b]` are arbitrary.
    pub hidden_states: Tensor,
}

impl TargetOutput {
    /// Check a forward's output against its input, as the round loop does after every
    /// forward of every [`TargetModel`]: logits `[B, S, V_t]` (with [`LogitRows::Last`] also
    /// `[B, 1, V_t]`) and hidden states `[B, S, width]`. Anything else is `bad-shape` naming
    /// `target.forward`.
    pub fn check(&self, input: &TargetInput<'_>, vocab: usize, width: usize) -> Result<()> {
        let (b, s) = (input.batch(), input.width);
        let ld = self.logits.dims();
        let rows_ok = ld.len() == 3
            && ld[0] == b
            && (ld[1] == s || (input.logits == LogitRows::Last && ld[1] == 1));
        if !rows_ok || ld[2] != vocab {
            let rows = match input.logits {
                LogitRows::All => format!("{s}"),
                LogitRows::Last => format!("1 or {s}"),
            };
            return Err(Error::bad_shape(
                "target.forward",
                format!("returned logits of shape {ld:?}, expected [{b}, {rows}, {vocab}]"),
            ));
        }
        let hd = self.hidden_states.dims();
        if hd != [b, s, width] {
            return Err(Error::bad_shape(
                "target.forward",
                format!("returned hidden states of shape {hd:?}, expected [{b}, {s}, {width}]"),
            ));
        }
        Ok(())
    }
}

/// A target model the speculator can drive: a batched forward over new tokens against a
/// per-request KV cache that can be rolled back.
///
/// Every implementation must pass [`crate::speculator::contract::check_target`].
pub trait TargetModel {
    /// The KV cache of a batch of requests (opaque to the speculator).
    type Cache;

    /// `V_t`: the logical vocabulary (logits width).
    fn vocab_size(&self) -> usize;
    /// Number of decoder layers.
    fn num_hidden_layers(&self) -> usize;
    /// Hidden width `H` (one capture id contributes `H` feature columns).
    fn hidden_size(&self) -> usize;
    /// Where logits and hidden states live.
    fn device(&self) -> Device;
    /// An empty cache for `batch` requests.
    fn new_cache(&self, batch: usize) -> Result<Self::Cache>;
    /// Append each row's new tokens (see [`TargetInput`]) and return their logits and the
    /// hidden states at `capture_layer_ids` (each in `0..num_hidden_layers`).
    fn forward(
        &self,
        cache: &mut Self::Cache,
        input: &TargetInput<'_>,
        capture_layer_ids: &[usize],
    ) -> Result<TargetOutput>;
    /// Keep the first `lengths[b]` tokens of row `b` (`invalid-argument` when a row holds
    /// fewer: a cache never grows by truncation).
    fn truncate(&self, cache: &mut Self::Cache, lengths: &[usize]) -> Result<()>;
    /// Tokens row `b` holds.
    fn cache_lengths(&self, cache: &Self::Cache) -> Vec<usize>;
}
