//! The per-request context KV cache of a drafter.
//!
//! A [`DraftState`] holds, for every draft layer, the keys (normed and rotated) and values of
//! the fused target context at absolute positions `start .. start + len`. A drafting round
//! appends only the new context positions (`Qwen3Drafter::extend`), runs one pass over the
//! block against the cached keys (block keys are never kept), and after verification the
//! state is rolled back with [`DraftState::truncate`] to the accepted prefix.

use candle_core::Tensor;

use crate::error::{Error, Result};

/// Cached context keys and values of one draft layer: `[kv_heads, len, head_dim]` each.
#[derive(Debug, Clone)]
pub(crate) struct LayerKv {
    pub(crate) k: Tensor,
    pub(crate) v: Tensor,
}

/// One request's drafting state: the context KV cache of every draft layer.
#[derive(Debug, Clone)]
pub struct DraftState {
    /// Absolute position of the first cached row.
    start: usize,
    /// Number of cached positions.
    len: usize,
    /// Number of layers this state was made for.
    num_layers: usize,
    /// Per layer; empty while `len == 0`.
    layers: Vec<LayerKv>,
}

impl DraftState {
    /// An empty state for a drafter with `num_layers` draft layers.
    pub fn new(num_layers: usize) -> Self {
        Self {
            start: 0,
            len: 0,
            num_layers,
            layers: Vec::new(),
        }
    }

    /// Number of cached context positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Absolute position of the first cached context row.
    pub fn start(&self) -> usize {
        self.start
    }

    /// One past the last cached position: where the next anchor sits.
    pub fn end(&self) -> usize {
        self.start + self.len
    }

    /// Number of draft layers this state serves.
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// Keep only the first `len` cached positions (roll back to the accepted prefix).
    ///
    /// Errors (`invalid-argument`) when `len` exceeds the cached length.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(Error::invalid(
                "len",
                format!(
                    "cannot truncate a draft state of {} positions to {len}",
                    self.len
                ),
            ));
        }
        if len == self.len {
            return Ok(());
        }
        if len == 0 {
            self.layers.clear();
        } else {
            for layer in &mut self.layers {
                layer.k = layer.k.narrow(1, 0, len)?;
                layer.v = layer.v.narrow(1, 0, len)?;
            }
        }
        self.len = len;
        Ok(())
    }

    /// Drop everything.
    pub fn clear(&mut self) {
        self.layers.clear();
        self.len = 0;
        self.start = 0;
    }

    /// Prepare to append rows given from absolute `position`: an empty state starts there;
    /// rows of positions the state already holds are skipped (returns how many); a gap after
    /// the cache is an error.
    pub(crate) fn seek(&mut self, position: usize) -> Result<usize> {
        if self.len == 0 {
            crate::limits::at_most(
                "start_position",
                position as u64,
                crate::limits::MAX_POSITION,
            )?;
            self.start = position;
            return Ok(0);
        }
        if position < self.start || position > self.end() {
            return Err(Error::invalid(
                "start_position",
                format!(
                    "{position} is outside the cached context [{}, {}]: features must continue \
                     the cache (rows of positions already held are skipped)",
                    self.start,
                    self.end()
                ),
            ));
        }
        Ok(self.end() - position)
    }

    /// Append `n` rows: one `(k, v)` pair per layer, each `[kv_heads, n, head_dim]`.
    pub(crate) fn append(&mut self, kv: Vec<LayerKv>, n: usize) -> Result<()> {
        if kv.len() != self.num_layers {
            return Err(Error::invalid(
                "state",
                format!(
                    "made for {} draft layers, got {}",
                    self.num_layers,
                    kv.len()
                ),
            ));
        }
        if self.layers.is_empty() {
            self.layers = kv;
        } else {
            for (layer, new) in self.layers.iter_mut().zip(kv) {
                layer.k = Tensor::cat(&[&layer.k, &new.k], 1)?;
                layer.v = Tensor::cat(&[&layer.v, &new.v], 1)?;
            }
        }
        self.len += n;
        Ok(())
    }

    /// Cached keys and values of layer `i` (`None` while empty).
    pub(crate) fn layer(&self, i: usize) -> Option<&LayerKv> {
        self.layers.get(i)
    }
}
