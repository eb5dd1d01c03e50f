//! The target side of the loop: [`TargetModel`], what a forward takes ([`TargetInput`]) and
//! what it gives back ([`TargetOutput`]); [`contract`], the suite every implementation passes;
//! [`qwen3`], the native Qwen3 target; [`gguf_files`] and [`gguf_tokenizer`], what a GGUF file
//! carries beside its tensors (config, tokenizer, chat template).
//!
//! Capture semantics (the one resolver in [`crate::config`]): capture id `c` is the input of
//! decoder layer `c` (HF `hidden_states[c]`; `0` = the embedding output). Only
//! `0..num_hidden_layers` are pre-norm layer outputs a drafter may fuse.

pub mod contract;
mod cost;
pub mod gguf_files;
pub mod gguf_tokenizer;
pub mod qwen3;

pub use cost::ForwardCost;
pub use qwen3::{Qwen3Cache, Qwen3Target};

use candle_core::{Device, Tensor};

use crate::error::{Error, Result};

/// Which positions of a forward need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows<'a> {
    /// Every new position: logits `[B, S, V_t]`.
    All,
    /// The last new position of each row only: logits `[B, 1, V_t]` (a prefill needs no more).
    /// Rows with no new token get an arbitrary (finite) row.
    Last,
    /// Row `b`'s last `tail[b]` new positions (`tail[b] <= num_tokens[b]`): logits
    /// `[B, max(tail), V_t]`, row `b`'s first `tail[b]` entries in position order, the rest
    /// arbitrary (finite). A step that verifies some rows and prefills others asks for every
    /// verified position and each prompt's last.
    Tail(&'a [usize]),
}

impl LogitRows<'_> {
    /// Logit rows per batch row of a forward `width` tokens wide.
    pub fn rows(&self, width: usize) -> usize {
        match self {
            LogitRows::All => width,
            LogitRows::Last => 1,
            LogitRows::Tail(t) => t.iter().copied().max().unwrap_or(0),
        }
    }

    /// For row `b` with `n` new tokens: the new-token index each of its logit rows shows, in
    /// order (`None` for the arbitrary padding rows), `rows(width)` entries.
    pub fn positions(&self, b: usize, n: usize, width: usize) -> Vec<Option<usize>> {
        let rows = self.rows(width);
        match self {
            LogitRows::All => (0..rows).map(|j| (j < n).then_some(j)).collect(),
            LogitRows::Last => vec![n.checked_sub(1)],
            LogitRows::Tail(t) => {
                let k = t.get(b).copied().unwrap_or(0).min(n);
                (0..rows).map(|j| (j < k).then_some(n - k + j)).collect()
            }
        }
    }
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
    pub logits: LogitRows<'a>,
}

impl TargetInput<'_> {
    /// `B`.
    pub fn batch(&self) -> usize {
        self.num_tokens.len()
    }

    /// Check the input's own consistency: `B·width` tokens, each row's count within the
    /// width, a [`LogitRows::Tail`] of `B` entries each within its row's count.
    pub fn check(&self) -> Result<()> {
        let b = self.batch();
        if self.tokens.len() != b * self.width {
            return Err(Error::bad_shape(
                "tokens",
                format!("{} ids for {b} rows of {}", self.tokens.len(), self.width),
            ));
        }
        if let Some(r) = (0..b).find(|&r| self.num_tokens[r] > self.width) {
            return Err(Error::invalid(
                "num_tokens",
                format!(
                    "row {r}: {} tokens in a row of {}",
                    self.num_tokens[r], self.width
                ),
            ));
        }
        if let LogitRows::Tail(t) = self.logits {
            if t.len() != b {
                return Err(Error::bad_shape(
                    "logits",
                    format!("{} tail counts for {b} rows", t.len()),
                ));
            }
            if let Some(r) = (0..b).find(|&r| t[r] > self.num_tokens[r]) {
                return Err(Error::invalid(
                    "logits",
                    format!(
                        "row {r}: logits of {} positions of {} new",
                        t[r], self.num_tokens[r]
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// What a forward returns.
#[derive(Debug, Clone)]
pub struct TargetOutput {
    /// `[B, R, V_t]` with `R` = [`LogitRows::rows`] (`S` for [`LogitRows::All`], `1` for
    /// [`LogitRows::Last`], the largest tail for [`LogitRows::Tail`]), any float dtype, on the
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
        let want = input.logits.rows(s);
        let rows_ok = ld.len() == 3
            && ld[0] == b
            && (ld[1] == want || (input.logits == LogitRows::Last && ld[1] == s));
        if !rows_ok || ld[2] != vocab {
            let rows = match input.logits {
                LogitRows::Last => format!("1 or {s}"),
                _ => format!("{want}"),
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
/// Every implementation must pass [`contract::check_target`].
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

    /// Whether [`TargetModel::grow`] and [`TargetModel::retain`] work: then requests can join
    /// and leave a running batch (continuous batching). Without, a batch keeps its rows until
    /// every request in it finishes.
    fn resizable(&self) -> bool {
        false
    }
    /// Append `n` empty rows to `cache` (requests joining a running batch). The other rows'
    /// contents, and their later logits, do not change.
    fn grow(&self, cache: &mut Self::Cache, n: usize) -> Result<()> {
        let _ = (cache, n);
        Err(Error::invalid(
            "target",
            "this target cannot add rows to a cache (continuous batching)",
        ))
    }
    /// Keep the rows `b` with `keep[b]`, in order, dropping the others (finished requests
    /// leave). The kept rows' contents, and their later logits, do not change.
    fn retain(&self, cache: &mut Self::Cache, keep: &[bool]) -> Result<()> {
        let _ = (cache, keep);
        Err(Error::invalid(
            "target",
            "this target cannot drop rows from a cache (continuous batching)",
        ))
    }
    /// What one forward costs by its shape (weights read, multiplies per token): the
    /// scheduler's prior before it has timed a forward. `None` (the default): the scheduler
    /// estimates it from the layers, hidden size and vocabulary ([`ForwardCost::estimate`]).
    fn forward_cost(&self) -> Result<Option<ForwardCost>> {
        Ok(None)
    }

    /// Whether a forward's cost follows its tokens (rows of very different lengths run
    /// without padding, as the native target's), rather than rows × its widest row: then a
    /// joining request's prefill rides the same forward as the running requests' rounds.
    fn ragged(&self) -> bool {
        false
    }
}

/// `TargetModel` for a pointer type that dereferences to a target: every method forwards.
macro_rules! forward_target {
    ($($ptr:ty),+) => {$(
        impl<T: TargetModel + ?Sized> TargetModel for $ptr {
            type Cache = T::Cache;

            fn vocab_size(&self) -> usize {
                (**self).vocab_size()
            }
            fn num_hidden_layers(&self) -> usize {
                (**self).num_hidden_layers()
            }
            fn hidden_size(&self) -> usize {
                (**self).hidden_size()
            }
            fn device(&self) -> Device {
                (**self).device()
            }
            fn new_cache(&self, batch: usize) -> Result<Self::Cache> {
                (**self).new_cache(batch)
            }
            fn forward(
                &self,
                cache: &mut Self::Cache,
                input: &TargetInput<'_>,
                capture_layer_ids: &[usize],
            ) -> Result<TargetOutput> {
                (**self).forward(cache, input, capture_layer_ids)
            }
            fn truncate(&self, cache: &mut Self::Cache, lengths: &[usize]) -> Result<()> {
                (**self).truncate(cache, lengths)
            }
            fn cache_lengths(&self, cache: &Self::Cache) -> Vec<usize> {
                (**self).cache_lengths(cache)
            }
            fn resizable(&self) -> bool {
                (**self).resizable()
            }
            fn grow(&self, cache: &mut Self::Cache, n: usize) -> Result<()> {
                (**self).grow(cache, n)
            }
            fn retain(&self, cache: &mut Self::Cache, keep: &[bool]) -> Result<()> {
                (**self).retain(cache, keep)
            }
            fn ragged(&self) -> bool {
                (**self).ragged()
            }
            fn forward_cost(&self) -> Result<Option<ForwardCost>> {
                (**self).forward_cost()
            }
        }
    )+};
}

forward_target!(std::sync::Arc<T>, &T);
