//! Test doubles for the speculator loop: [`ToyTarget`], a deterministic toy LM behind the public
//! [`TargetModel`] trait with a real (token-level) cache, and [`OracleDrafter`], a [`Drafter`]
//! that proposes the toy's own continuation (greedy, optionally corrupted, or sampled from a
//! genuine distribution `q`) and logs every call the loop makes to it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;

use candle_core::{DType, Device, Tensor};
use dspark::checkpoint::WeightSource;
use dspark::error::{Error, Result};
use dspark::sampling::Seeds;
use dspark::speculator::{LogitRows, TargetInput, TargetModel, TargetOutput};
use dspark::vocab::VocabSizes;
use dspark::{Drafter, DrafterInfo, IdMap, Proposal, ProposeOptions};

/// SplitMix64 finalizer: the toy's only source of "weights".
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform in `[0, 1)` from 53 bits of `z`.
pub fn unit(z: u64) -> f64 {
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The toy language model: the logits of the token after `cur` (at position `pos`) depend on
/// `cur`, the token before it and `pos % 7`. A third of the rows are flat, a third spread, a
/// third peaked on one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToyLm {
    pub vocab: usize,
    pub seed: u64,
}

impl ToyLm {
    pub fn new(vocab: usize, seed: u64) -> Self {
        Self { vocab, seed }
    }

    /// Logits of the token at `pos + 1`, given `cur` at `pos` and `prev` at `pos - 1`.
    pub fn logits(&self, prev: Option<u32>, cur: u32, pos: usize) -> Vec<f32> {
        let h = mix(self.seed
            ^ mix(prev.map_or(u64::MAX, u64::from))
            ^ mix((u64::from(cur) << 24) ^ 0xC0FFEE)
            ^ mix((pos % 7) as u64 + 0x1234_5678_0000));
        let (scale, spike) = match h % 3 {
            0 => (0.3, 0.0),
            1 => (1.5, 0.0),
            _ => (1.0, 5.0),
        };
        let top = (mix(h ^ 0x55) % self.vocab as u64) as usize;
        (0..self.vocab)
            .map(|v| {
                let u = unit(mix(h.wrapping_add(v as u64 + 1)));
                let spike = if v == top { spike } else { 0.0 };
                (scale * (2.0 * u - 1.0) * 2.0 + spike) as f32
            })
            .collect()
    }

    /// Logits of the token after a whole context (its last token sits at `ctx.len() - 1`).
    pub fn next_logits(&self, ctx: &[u32]) -> Vec<f32> {
        let n = ctx.len();
        let prev = (n >= 2).then(|| ctx[n - 2]);
        self.logits(prev, ctx[n - 1], n - 1)
    }

    /// Greedy continuation of `ctx` by `n` tokens.
    pub fn greedy(&self, ctx: &[u32], n: usize) -> Vec<u32> {
        let mut ctx = ctx.to_vec();
        let start = ctx.len();
        for _ in 0..n {
            let t = argmax(&self.next_logits(&ctx));
            ctx.push(t);
        }
        ctx.split_off(start)
    }
}

/// Argmax, lowest id on ties (the kernels' rule).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The hidden state the toy gives token `token` at `pos` for capture id `capture`: columns 0,
/// 1, 2 hold the token, the position and the capture id (so a drafter can decode them), the
/// rest a smooth function of the three. Capture 0 (the embedding output) depends on the token
/// only, as a real model's does.
pub fn hidden_row(token: u32, pos: usize, capture: usize, width: usize) -> Vec<f32> {
    let pos = if capture == 0 { 0.0 } else { pos as f32 };
    (0..width)
        .map(|j| match j {
            0 => token as f32,
            1 => pos,
            2 => capture as f32,
            _ => (0.37 * token as f32 * (j + 1) as f32
                + 0.11 * pos
                + 0.7 * capture as f32
                + j as f32)
                .sin(),
        })
        .collect()
}

/// The concatenated feature row for `captures`.
pub fn feature_row(token: u32, pos: usize, captures: &[usize], hidden: usize) -> Vec<f32> {
    captures
        .iter()
        .flat_map(|&c| hidden_row(token, pos, c, hidden))
        .collect()
}

/// Which logits a forward asked for (an owned [`LogitRows`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rows {
    All,
    Last,
    Tail(Vec<usize>),
}

impl Rows {
    fn of(r: LogitRows<'_>) -> Self {
        match r {
            LogitRows::All => Rows::All,
            LogitRows::Last => Rows::Last,
            LogitRows::Tail(t) => Rows::Tail(t.to_vec()),
        }
    }
}

/// One forward as the toy saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub num_tokens: Vec<usize>,
    pub width: usize,
    pub logits: Rows,
    pub capture: Vec<usize>,
}

/// What a [`ToyTarget`] was asked to do.
#[derive(Debug, Clone, Default)]
pub struct ToyLog {
    pub calls: Vec<Call>,
    /// Tokens fed, all forwards together.
    pub tokens: usize,
    /// Per batch row of the latest cache: forwards in which the row had new tokens.
    pub row_forwards: Vec<usize>,
    pub truncates: usize,
    /// The latest cache's contents after its latest forward or truncation.
    pub cache: Vec<Vec<u32>>,
}

/// A deterministic toy target with a per-row token cache.
#[derive(Debug)]
pub struct ToyTarget {
    pub lm: ToyLm,
    pub layers: usize,
    pub hidden: usize,
    /// The logits dtype handed to the loop.
    pub dtype: DType,
    /// Whether it grows and retains cache rows (continuous batching); off by default, so a
    /// batch keeps its rows (the log's row indices are request indices).
    pub resizable: bool,
    /// `(token, from)`: a row whose first token is `token` has NaN logits at every position
    /// from `from` on (a request whose own rows fail verification).
    pub poison: Option<(u32, usize)>,
    pub log: RefCell<ToyLog>,
}

/// The toy's KV cache: the tokens of every row.
#[derive(Debug, Clone)]
pub struct ToyCache(pub Vec<Vec<u32>>);

impl ToyTarget {
    pub fn new(vocab: usize, layers: usize, hidden: usize, seed: u64) -> Self {
        Self {
            lm: ToyLm::new(vocab, seed),
            layers,
            hidden,
            dtype: DType::F32,
            resizable: false,
            poison: None,
            log: RefCell::new(ToyLog::default()),
        }
    }

    /// The same toy, resizable (continuous batching).
    pub fn into_resizable(mut self) -> Self {
        self.resizable = true;
        self
    }

    pub fn forwards(&self) -> usize {
        self.log.borrow().calls.len()
    }
}

impl TargetModel for ToyTarget {
    type Cache = ToyCache;

    fn vocab_size(&self) -> usize {
        self.lm.vocab
    }

    fn num_hidden_layers(&self) -> usize {
        self.layers
    }

    fn hidden_size(&self) -> usize {
        self.hidden
    }

    fn device(&self) -> Device {
        Device::Cpu
    }

    fn new_cache(&self, batch: usize) -> Result<ToyCache> {
        let mut log = self.log.borrow_mut();
        log.row_forwards = vec![0; batch];
        log.cache = vec![Vec::new(); batch];
        Ok(ToyCache(vec![Vec::new(); batch]))
    }

    fn forward(
        &self,
        cache: &mut ToyCache,
        input: &TargetInput<'_>,
        capture: &[usize],
    ) -> Result<TargetOutput> {
        let (b, s, v) = (input.batch(), input.width, self.lm.vocab);
        if b != cache.0.len() || input.tokens.len() != b * s {
            return Err(Error::bad_shape("input", "batch or width does not fit"));
        }
        if let Some(&c) = capture.iter().find(|&&c| c >= self.layers) {
            return Err(Error::invalid("capture", format!("{c} >= {}", self.layers)));
        }
        // Validate everything first: a failed forward leaves the cache alone.
        for (r, &n) in input.num_tokens.iter().enumerate() {
            if n > s {
                return Err(Error::bad_shape("num_tokens", format!("{n} > width {s}")));
            }
            if let Some(&tok) = input.tokens[r * s..r * s + n]
                .iter()
                .find(|&&t| t as usize >= v)
            {
                return Err(Error::TokenOutOfRange {
                    name: "toy input".into(),
                    id: i64::from(tok),
                    vocab_size: v,
                });
            }
        }
        input.check()?;
        let rows = input.logits.rows(s);
        let fw = capture.len() * self.hidden;
        // Positions nobody may read are NaN (canaries); `Last` rows of idle requests are finite.
        let mut logits = vec![f32::NAN; b * rows * v];
        let mut hidden = vec![f32::NAN; b * s * fw];
        let mut log = self.log.borrow_mut();
        if log.row_forwards.len() < b {
            log.row_forwards.resize(b, 0);
        }
        for (r, &n) in input.num_tokens.iter().enumerate() {
            if n == 0 && input.logits == LogitRows::Last {
                logits[r * v..(r + 1) * v].fill(0.0);
            }
            // Rows nobody reads beyond a short tail are finite (the contract says arbitrary).
            let at_of: Vec<Option<usize>> = input.logits.positions(r, n, s);
            for (k, a) in at_of.iter().enumerate() {
                if a.is_none() && matches!(input.logits, LogitRows::Tail(_)) {
                    logits[(r * rows + k) * v..(r * rows + k + 1) * v].fill(0.0);
                }
            }
            if n > 0 {
                log.row_forwards[r] += 1;
            }
            let row = &mut cache.0[r];
            for j in 0..n {
                let tok = input.tokens[r * s + j];
                let pos = row.len();
                let mut l = self.lm.logits(row.last().copied(), tok, pos);
                row.push(tok);
                if let Some((p, from)) = self.poison
                    && row[0] == p
                    && pos >= from
                {
                    l.fill(f32::NAN);
                }
                let at = at_of.iter().position(|&a| a == Some(j));
                if let Some(at) = at {
                    logits[(r * rows + at) * v..(r * rows + at + 1) * v].copy_from_slice(&l);
                }
                let f = feature_row(tok, pos, capture, self.hidden);
                hidden[(r * s + j) * fw..(r * s + j + 1) * fw].copy_from_slice(&f);
            }
        }
        log.calls.push(Call {
            num_tokens: input.num_tokens.to_vec(),
            width: s,
            logits: Rows::of(input.logits),
            capture: capture.to_vec(),
        });
        log.tokens += input.num_tokens.iter().sum::<usize>();
        log.cache = cache.0.clone();
        Ok(TargetOutput {
            logits: Tensor::from_vec(logits, (b, rows, v), &Device::Cpu)?.to_dtype(self.dtype)?,
            hidden_states: Tensor::from_vec(hidden, (b, s, fw), &Device::Cpu)?,
        })
    }

    fn truncate(&self, cache: &mut ToyCache, lengths: &[usize]) -> Result<()> {
        if lengths.len() != cache.0.len() {
            return Err(Error::bad_shape("lengths", "one per row"));
        }
        for (r, (&n, row)) in lengths.iter().zip(&cache.0).enumerate() {
            if n > row.len() {
                return Err(Error::invalid(
                    "lengths",
                    format!("row {r} holds {} tokens, asked to keep {n}", row.len()),
                ));
            }
        }
        for (&n, row) in lengths.iter().zip(&mut cache.0) {
            row.truncate(n);
        }
        let mut log = self.log.borrow_mut();
        log.truncates += 1;
        log.cache = cache.0.clone();
        Ok(())
    }

    fn cache_lengths(&self, cache: &ToyCache) -> Vec<usize> {
        cache.0.iter().map(Vec::len).collect()
    }

    fn resizable(&self) -> bool {
        self.resizable
    }

    fn grow(&self, cache: &mut ToyCache, n: usize) -> Result<()> {
        if !self.resizable {
            return Err(Error::invalid("target", "not resizable"));
        }
        cache.0.extend((0..n).map(|_| Vec::new()));
        let mut log = self.log.borrow_mut();
        log.row_forwards.extend(std::iter::repeat_n(0, n));
        log.cache = cache.0.clone();
        Ok(())
    }

    fn retain(&self, cache: &mut ToyCache, keep: &[bool]) -> Result<()> {
        if !self.resizable || keep.len() != cache.0.len() {
            return Err(Error::bad_shape("keep", "one per row"));
        }
        let mut it = keep.iter();
        cache.0.retain(|_| it.next().copied().unwrap_or(false));
        let mut log = self.log.borrow_mut();
        let mut it = keep.iter();
        log.row_forwards
            .retain(|_| it.next().copied().unwrap_or(false));
        log.cache = cache.0.clone();
        Ok(())
    }

    fn ragged(&self) -> bool {
        true
    }
}

/// How an [`OracleDrafter`] drafts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// The toy's greedy continuation; slot `k` is wrong when `corrupt_every > 0` and
    /// `(k + 1) % corrupt_every == 0`. One-hot draft logits (a deterministic drafter is exact).
    /// Confidence 0.1 on the slots it corrupts, 0.9 elsewhere (a function of the slot only).
    Greedy { corrupt_every: usize },
    /// Sampled from a genuine distribution `q` (a perturbed, partly truncated toy row).
    Sampling,
    /// Samples from `q` but reports the toy's own row as its draft logits (not exact: the
    /// power check of the statistical tests).
    Lying,
}

/// A deliberate contract violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// A proposal for one request more than asked.
    WrongBatch,
    /// Draft logits one value short.
    ShortDraftLogits,
    /// Confidences one value short.
    ShortConfidence,
    /// Drafts the id `V_t` (out of range).
    OutOfRangeToken,
    /// A call holding a context that starts with this token fails as a drafter whose context
    /// went non-finite does (`non-finite` on its base logits).
    NonFiniteFor(u32),
}

/// One `extend` call.
#[derive(Debug, Clone, PartialEq)]
pub struct Extend {
    pub state: usize,
    pub start: usize,
    pub tokens: Vec<u32>,
}

/// One `propose_cached` call.
#[derive(Debug, Clone, PartialEq)]
pub struct Propose {
    pub states: Vec<usize>,
    /// `state_end` of each state (where its anchor sits).
    pub ends: Vec<usize>,
    pub anchors: Vec<u32>,
    pub temperature: f32,
}

/// Every call the loop made to an [`OracleDrafter`].
#[derive(Debug, Clone, Default)]
pub struct DraftLog {
    pub states: usize,
    pub extends: Vec<Extend>,
    pub proposals: Vec<Propose>,
    pub truncates: usize,
}

/// A drafter that knows the toy LM (it reads tokens and positions back from the features).
#[derive(Debug)]
pub struct OracleDrafter {
    pub lm: ToyLm,
    pub k: usize,
    pub capture: Vec<usize>,
    pub target_layer_ids: Vec<i64>,
    pub hidden: usize,
    pub vocab: VocabSizes,
    pub id_map: IdMap,
    pub mode: Mode,
    pub confidence: bool,
    pub fault: Fault,
    pub log: RefCell<DraftLog>,
    /// What [`Drafter::info`] returns (kept in step with the fields above by the builders).
    pub info: DrafterInfo,
}

/// An [`OracleDrafter`]'s per-request context.
#[derive(Debug, Clone)]
pub struct OracleState {
    pub id: usize,
    /// Token of every context position `0..len`.
    pub tokens: Vec<u32>,
}

impl OracleDrafter {
    /// A greedy oracle of `k` drafts for `target`, fusing capture ids `capture`.
    pub fn new(target: &ToyTarget, k: usize, capture: &[usize], mode: Mode) -> Self {
        let v = target.lm.vocab;
        let target_layer_ids: Vec<i64> = capture.iter().map(|&c| c as i64 - 1).collect();
        Self {
            lm: target.lm,
            k,
            capture: capture.to_vec(),
            target_layer_ids: target_layer_ids.clone(),
            hidden: target.hidden,
            vocab: VocabSizes::new(v, v, v),
            id_map: IdMap::identity(v).unwrap(),
            mode,
            confidence: true,
            fault: Fault::None,
            log: RefCell::new(DraftLog::default()),
            info: DrafterInfo {
                block_size: k,
                num_draft_tokens: k,
                noise_token: 0,
                vocab: VocabSizes::new(v, v, v),
                embed_source: WeightSource::SharedTarget,
                lm_head_source: WeightSource::SharedTarget,
                target_layer_ids,
                capture_layer_ids: capture.to_vec(),
                sample_from_anchor: true,
                has_confidence_head: true,
                context_width: capture.len() * target.hidden,
            },
        }
    }

    pub fn with_fault(mut self, fault: Fault) -> Self {
        self.fault = fault;
        self
    }

    pub fn without_confidence(mut self) -> Self {
        self.confidence = false;
        self.info.has_confidence_head = false;
        self
    }

    /// The distribution `q` the sampling modes draw slot `slot` from after `ctx`, as logits.
    pub fn q_logits(&self, ctx: &[u32], slot: usize, temperature: f32) -> Vec<f32> {
        let p = self.lm.next_logits(ctx);
        let keep = argmax(&p) as usize;
        let h = mix(self.lm.seed ^ 0xD1CE ^ mix(ctx.len() as u64) ^ mix(slot as u64 + 99));
        let t = temperature.max(0.25);
        p.iter()
            .enumerate()
            .map(|(v, &x)| {
                let z = mix(h.wrapping_add(v as u64));
                if v != keep && z.is_multiple_of(6) {
                    f32::NEG_INFINITY // outside q's support
                } else {
                    0.8 * x / t + (unit(z) as f32 - 0.5) * 1.5
                }
            })
            .collect()
    }

    fn seed(opts: &ProposeOptions, b: usize) -> u64 {
        match &opts.seeds {
            Seeds::Scalar(s) => mix(*s ^ mix(b as u64)),
            Seeds::PerRequest(v) => v[b],
        }
    }

    /// One request's block: tokens, draft-logit rows, confidences.
    fn draft(
        &self,
        state: &OracleState,
        anchor: u32,
        seed: u64,
        temperature: f32,
    ) -> (Vec<u32>, Vec<f32>, Vec<f32>) {
        let v = self.lm.vocab;
        let mut ctx = state.tokens.clone();
        ctx.push(anchor);
        let (mut toks, mut logits, mut conf) = (Vec::new(), Vec::new(), Vec::new());
        for slot in 0..self.k {
            let (x, row, c) = match self.mode {
                Mode::Greedy { corrupt_every } => {
                    let mut x = argmax(&self.lm.next_logits(&ctx));
                    let bad = corrupt_every > 0 && (slot + 1) % corrupt_every == 0;
                    if bad {
                        x = (x + 1) % v as u32;
                    }
                    let mut row = vec![f32::NEG_INFINITY; v];
                    row[x as usize] = 0.0;
                    (x, row, if bad { 0.1 } else { 0.9 })
                }
                Mode::Sampling | Mode::Lying => {
                    let q = self.q_logits(&ctx, slot, temperature);
                    let probs = softmax(&q);
                    let u = unit(mix(seed ^ mix(slot as u64 + 7)));
                    let mut acc = 0.0;
                    let mut x = argmax(&q);
                    for (i, &pr) in probs.iter().enumerate() {
                        acc += pr;
                        if pr > 0.0 && u < acc {
                            x = i as u32;
                            break;
                        }
                    }
                    // Like the real head: a function of the slot's distribution (the context
                    // and the token drafted before it), never of the token drawn at the slot
                    // (a threshold that looks at `x` itself would not be lossless).
                    let c = 0.35 + 0.6 * probs.iter().copied().fold(0.0, f64::max) as f32;
                    let row = if self.mode == Mode::Lying {
                        self.lm.next_logits(&ctx)
                    } else {
                        q
                    };
                    (x, row, c)
                }
            };
            let x = if self.fault == Fault::OutOfRangeToken {
                v as u32
            } else {
                x
            };
            toks.push(x);
            logits.extend(row);
            conf.push(c);
            ctx.push(x);
        }
        (toks, logits, conf)
    }
}

/// Softmax in f64 (`-inf` → 0).
pub fn softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = l.iter().map(|&x| f64::from(x - m).exp()).collect();
    let z: f64 = w.iter().sum();
    w.iter().map(|x| x / z).collect()
}

impl Drafter for OracleDrafter {
    type State = OracleState;

    fn info(&self) -> &DrafterInfo {
        &self.info
    }
    fn id_map(&self) -> &IdMap {
        &self.id_map
    }

    fn new_state(&self) -> Result<OracleState> {
        let mut log = self.log.borrow_mut();
        log.states += 1;
        Ok(OracleState {
            id: log.states - 1,
            tokens: Vec::new(),
        })
    }

    /// Checks every feature row against the toy's hidden state of the token it encodes at the
    /// position it is claimed for (`callback` error otherwise).
    fn extend(&self, state: &mut OracleState, features: &Tensor, start: usize) -> Result<()> {
        let (t, w) = features.dims2()?;
        if w != self.info().context_width {
            return Err(Error::bad_shape("features", format!("width {w}")));
        }
        if start > state.tokens.len() {
            return Err(Error::invalid("start_position", "a gap"));
        }
        let rows = features.to_vec2::<f32>()?;
        let mut tokens = Vec::with_capacity(t);
        for (r, row) in rows.iter().enumerate() {
            let tok = row[0] as u32;
            let want = feature_row(tok, start + r, &self.capture, self.hidden);
            if *row != want {
                return Err(Error::callback(
                    "drafter.extend",
                    format!(
                        "state {}: feature row {r} (claimed position {}) encodes token {} at \
                         position {}",
                        state.id,
                        start + r,
                        row[0],
                        row[1]
                    ),
                ));
            }
            tokens.push(tok);
            if start + r >= state.tokens.len() {
                state.tokens.push(tok);
            }
        }
        self.log.borrow_mut().extends.push(Extend {
            state: state.id,
            start,
            tokens,
        });
        Ok(())
    }

    fn truncate(&self, state: &mut OracleState, len: usize) -> Result<()> {
        if len > state.tokens.len() {
            return Err(Error::invalid("len", "grows"));
        }
        state.tokens.truncate(len);
        self.log.borrow_mut().truncates += 1;
        Ok(())
    }

    fn state_end(&self, state: &OracleState) -> usize {
        state.tokens.len()
    }

    fn propose_cached(
        &self,
        states: &[&OracleState],
        anchors: &[u32],
        opts: &ProposeOptions,
    ) -> Result<Proposal> {
        let v = self.lm.vocab;
        if let Fault::NonFiniteFor(p) = self.fault
            && let Some(b) = states.iter().position(|s| s.tokens.first() == Some(&p))
        {
            return Err(Error::NonFinite {
                name: "base_logits".into(),
                message: format!("row {b} holds NaN"),
            });
        }
        let (mut tokens, mut draft_logits, mut confidence) = (Vec::new(), Vec::new(), Vec::new());
        for (b, (s, &a)) in states.iter().zip(anchors).enumerate() {
            let (t, l, c) = self.draft(s, a, Self::seed(opts, b), opts.temperature);
            tokens.extend(t);
            draft_logits.extend(l);
            confidence.extend(c);
        }
        self.log.borrow_mut().proposals.push(Propose {
            states: states.iter().map(|s| s.id).collect(),
            ends: states.iter().map(|s| s.tokens.len()).collect(),
            anchors: anchors.to_vec(),
            temperature: opts.temperature,
        });
        match self.fault {
            Fault::ShortDraftLogits => {
                draft_logits.pop();
            }
            Fault::ShortConfidence => {
                confidence.pop();
            }
            _ => {}
        }
        Ok(Proposal {
            batch: states.len() + usize::from(self.fault == Fault::WrongBatch),
            slots: self.k,
            target_vocab: v,
            tokens,
            draft_logits,
            confidence: self.confidence.then_some(confidence),
        })
    }

    fn propose(
        &self,
        context: &Tensor,
        anchors: &[u32],
        start_positions: &[usize],
        opts: &ProposeOptions,
    ) -> Result<Proposal> {
        let b = context.dims3()?.0;
        let mut states = Vec::with_capacity(b);
        for i in 0..b {
            let mut s = self.new_state()?;
            s.tokens = vec![0; start_positions[i.min(start_positions.len() - 1)]];
            let start = s.tokens.len();
            self.extend(&mut s, &context.get(i)?, start)?;
            states.push(s);
        }
        let refs: Vec<&OracleState> = states.iter().collect();
        self.propose_cached(&refs, anchors, opts)
    }
}
