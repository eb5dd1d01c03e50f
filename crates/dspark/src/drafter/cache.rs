//! The per-request context KV cache of a drafter.
//!
//! A [`DraftState`] holds, for every draft layer, the keys (normed and rotated) and values of
//! the fused target context at absolute positions `start .. start + len`. A drafting round
//! appends only the new context positions (`Qwen3Drafter::extend`), runs one pass over the
//! block against the cached keys (block keys are never kept), and after verification the
//! state is rolled back with [`DraftState::truncate`] to the accepted prefix.
//!
//! On the CPU (fast kernel path) the keys and values live in host panel buffers
//! ([`PanelKv`], f32) with room to spare: an append writes the new rows in place (the buffer
//! doubles when full), a rollback only moves the length, and the block pass writes the block's
//! keys and values after the context as scratch and attends over both where they lie. A
//! round's cost then follows the new rows and one read of the context, not copies of it (at
//! 3,000 tokens of context, concatenating every layer's cache per round cost more than the
//! target's verification). Elsewhere they are tensors `[kv_heads, len, head_dim]`.

use std::sync::{Mutex, MutexGuard};

use candle_core::Tensor;

use crate::error::{Error, Result};
use crate::nn::WeightDtype;
use crate::nn::attention::{PanelKv, PanelShape, Visible};
use crate::nn::packed::PANEL;

/// Cached context keys and values of one draft layer: `[kv_heads, len, head_dim]` each.
#[derive(Debug, Clone)]
pub(crate) struct LayerKv {
    pub(crate) k: Tensor,
    pub(crate) v: Tensor,
}

/// Host panel buffers of every layer, `cap` tokens each (a multiple of 16).
#[derive(Debug, Clone)]
pub(crate) struct HostLayers {
    layers: Vec<PanelKv>,
    kv_heads: usize,
    head_dim: usize,
    cap: usize,
}

impl HostLayers {
    fn shape(&self) -> PanelShape {
        (self.kv_heads, self.head_dim, self.cap)
    }
}

/// Where a state keeps its rows.
#[derive(Debug)]
enum Store {
    /// Nothing cached yet.
    Empty,
    /// Device tensors, one pair per layer.
    Tensors(Vec<LayerKv>),
    /// Host panels (the block pass writes scratch rows through the lock from a shared state).
    Host(Mutex<HostLayers>),
}

impl Clone for Store {
    fn clone(&self) -> Self {
        match self {
            Self::Empty => Self::Empty,
            Self::Tensors(t) => Self::Tensors(t.clone()),
            // A poisoned lock (a panic mid block pass) only ever left scratch rows past the
            // length half written: the live rows copy as they are.
            Self::Host(h) => Self::Host(Mutex::new(
                h.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            )),
        }
    }
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
    store: Store,
}

fn poisoned() -> Error {
    Error::invalid("state", "a drafting call panicked while it held this state")
}

impl DraftState {
    /// An empty state for a drafter with `num_layers` draft layers.
    pub fn new(num_layers: usize) -> Self {
        Self {
            start: 0,
            len: 0,
            num_layers,
            store: Store::Empty,
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
        match &mut self.store {
            Store::Tensors(_) if len == 0 => self.store = Store::Empty,
            Store::Tensors(layers) => {
                for layer in layers {
                    layer.k = layer.k.narrow(1, 0, len)?;
                    layer.v = layer.v.narrow(1, 0, len)?;
                }
            }
            // Host rows past the length are scratch: nothing to do.
            Store::Host(_) | Store::Empty => {}
        }
        self.len = len;
        Ok(())
    }

    /// Drop everything.
    pub fn clear(&mut self) {
        self.store = Store::Empty;
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
        match &mut self.store {
            Store::Tensors(layers) => {
                for (layer, new) in layers.iter_mut().zip(kv) {
                    layer.k = Tensor::cat(&[&layer.k, &new.k], 1)?;
                    layer.v = Tensor::cat(&[&layer.v, &new.v], 1)?;
                }
            }
            Store::Empty => self.store = Store::Tensors(kv),
            Store::Host(_) => {
                return Err(Error::invalid(
                    "state",
                    "holds host rows: append through the host path",
                ));
            }
        }
        self.len += n;
        Ok(())
    }

    /// Cached keys and values of layer `i` as tensors (`None` while empty; a host state gives
    /// copies of its live rows, `[kv_heads, len, head_dim]`).
    pub(crate) fn layer(&self, i: usize) -> Result<Option<LayerKv>> {
        Ok(match &self.store {
            Store::Empty => None,
            Store::Tensors(layers) => layers.get(i).cloned(),
            Store::Host(h) => {
                let h = h.lock().map_err(|_| poisoned())?;
                let Some(kv) = h.layers.get(i) else {
                    return Ok(None);
                };
                let (kt, v) = kv.to_tensors(h.shape(), &candle_core::Device::Cpu)?;
                Some(LayerKv {
                    k: kt.narrow(2, 0, self.len)?.transpose(1, 2)?.contiguous()?,
                    v: v.narrow(0, 0, self.len)?.transpose(0, 1)?.contiguous()?,
                })
            }
        })
    }

    /// Host path: write `n` new rows per layer after the cached ones, `rows(layer)` giving
    /// that layer's keys and values `[n, kv_heads, head_dim]` (f32); the buffers grow to hold
    /// `n + spare` more rows (`spare`: a block pass's scratch). Errors when the state holds
    /// tensors.
    pub(crate) fn append_host(
        &mut self,
        (kv_heads, head_dim): (usize, usize),
        (n, spare): (usize, usize),
        mut rows: impl FnMut(usize) -> Result<(Vec<f32>, Vec<f32>)>,
    ) -> Result<()> {
        let len = self.len;
        let needed = len + n + spare;
        let host = match &mut self.store {
            Store::Tensors(_) => {
                return Err(Error::invalid(
                    "state",
                    "holds device rows: append through the tensor path",
                ));
            }
            Store::Empty => {
                self.store = Store::Host(Mutex::new(HostLayers {
                    layers: Vec::new(),
                    kv_heads,
                    head_dim,
                    cap: 0,
                }));
                match &mut self.store {
                    Store::Host(h) => h.get_mut().map_err(|_| poisoned())?,
                    _ => return Err(poisoned()),
                }
            }
            Store::Host(h) => h.get_mut().map_err(|_| poisoned())?,
        };
        if (host.kv_heads, host.head_dim) != (kv_heads, head_dim) {
            return Err(Error::invalid(
                "state",
                format!(
                    "made for {} kv heads of {}, this drafter has {kv_heads} of {head_dim}",
                    host.kv_heads, host.head_dim
                ),
            ));
        }
        if needed > host.cap || host.layers.len() != self.num_layers {
            let cap = needed
                .max(host.cap.saturating_mul(2))
                .max(64)
                .checked_next_multiple_of(PANEL)
                .ok_or_else(|| Error::too_large("draft state", needed, usize::MAX as u64, ""))?;
            crate::limits::output_elements(
                "draft state",
                &[cap as u64, kv_heads as u64, head_dim as u64],
            )?;
            let old = std::mem::take(&mut host.layers);
            host.layers = (0..self.num_layers)
                .map(|i| {
                    let shape = (kv_heads, head_dim, cap);
                    PanelKv::grown(WeightDtype::F32, old.get(i), shape, host.cap, len)
                })
                .collect();
            host.cap = cap;
        }
        let shape = host.shape();
        for (i, kv) in host.layers.iter_mut().enumerate() {
            let (k, v) = rows(i)?;
            kv.write(shape, len, &k, &v);
        }
        self.len += n;
        Ok(())
    }

    /// Host path: the block pass of layer `layer`: write the block's keys and values (`[Q,
    /// kv_heads, head_dim]`) after the context as scratch, then attention of `q: [Q, heads,
    /// head_dim]` over the context and the whole block, `[Q, heads · head_dim]`. `None` when
    /// the state does not hold host rows with room for the block.
    pub(crate) fn attend_block(
        &self,
        layer: usize,
        (q, k, v): (&[f32], &[f32], &[f32]),
        (q_len, heads): (usize, usize),
        scale: f32,
    ) -> Option<Result<Vec<f32>>> {
        let Store::Host(h) = &self.store else {
            return None;
        };
        let mut h: MutexGuard<'_, HostLayers> = match h.lock() {
            Ok(h) => h,
            Err(_) => return Some(Err(poisoned())),
        };
        let (shape, len) = (h.shape(), self.len);
        if len + q_len > shape.2 {
            return None;
        }
        let kv = h.layers.get_mut(layer)?;
        kv.write(shape, len, k, v);
        let out = kv.attend(shape, q, (q_len, heads), (len + q_len, Visible::All), scale)?;
        Some(Ok(out))
    }

    /// Whether the rows live in host panels.
    pub(crate) fn is_host(&self) -> bool {
        matches!(self.store, Store::Host(_))
    }

    /// Whether the rows live in tensors.
    pub(crate) fn uses_tensors(&self) -> bool {
        matches!(self.store, Store::Tensors(_))
    }
}
