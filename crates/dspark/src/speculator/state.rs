//! The state of one generation ([`Run`]): per-request lengths, anchors, outputs and the target
//! cache, shared by the speculative loop and target-only decoding.

use std::time::Instant;

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

use super::options::{Request, SpeculatorOptions, Use, derive_seed};
use super::stats::Stats;
use super::target::{LogitRows, TargetInput, TargetModel, TargetOutput};
use super::{OnRound, RoundUpdate};
use crate::device::use_tensor_path;
use crate::error::{Error, Result};
use crate::limits::{MAX_BATCH, MAX_POSITION, at_most};
use crate::sampling::{
    Floats, PerRequest, Rows3, Seeds, Tokens, Verification, VerifyOptions, verify, verify_slices,
};

/// The state of one generation: per-request lengths, anchors, outputs, the target cache.
pub(crate) struct Run<'a, T: TargetModel> {
    pub(crate) target: &'a T,
    pub(crate) options: &'a SpeculatorOptions,
    pub(crate) requests: &'a [Request],
    pub(crate) capture: &'a [usize],
    pub(crate) vocab: usize,
    pub(crate) cache: T::Cache,
    pub(crate) out: Vec<Vec<u32>>,
    pub(crate) done: Vec<bool>,
    pub(crate) prefilled: Vec<bool>,
    /// Tokens whose target KV is committed (the anchor sits at this position).
    pub(crate) lengths: Vec<usize>,
    pub(crate) anchors: Vec<u32>,
    pub(crate) shown: Vec<usize>,
    /// Per request, the previous round's confidences (the pipelined policy's stale input).
    pub(crate) stale: Vec<Option<Vec<f32>>>,
    /// Rounds since the last one that drafted, and the streak of plain rounds after which the
    /// next one drafts anyway (module `drafting`).
    pub(crate) since_draft: usize,
    pub(crate) refresh_after: usize,
    /// Per request, the target features of plain rounds not yet in its drafter context, and
    /// the position the first of them belongs at: appended in one call before the request's
    /// next proposal (module `drafting`).
    pub(crate) pending: Vec<(usize, Vec<Tensor>)>,
    /// Per draft position, the confidences of the slots counted in
    /// `stats.position_attempts`, summed: what the head predicted there, against
    /// `stats.position_accepts`, what happened (the schedulers' online recalibration).
    pub(crate) predicted: Vec<f64>,
    pub(crate) stats: Stats,
}

impl<'a, T: TargetModel> Run<'a, T> {
    pub(crate) fn new(
        target: &'a T,
        options: &'a SpeculatorOptions,
        requests: &'a [Request],
        capture: &'a [usize],
    ) -> Result<Self> {
        let vocab = target.vocab_size();
        at_most("requests", requests.len() as u64, MAX_BATCH)?;
        for (i, r) in requests.iter().enumerate() {
            if r.prompt.is_empty() {
                return Err(Error::invalid(
                    format!("requests[{i}].prompt"),
                    "empty: a prompt needs at least one token",
                ));
            }
            let check = |ids: &[u32], what: &str| match ids.iter().find(|&&t| t as usize >= vocab) {
                Some(&t) => Err(Error::TokenOutOfRange {
                    name: format!("requests[{i}].{what}"),
                    id: i64::from(t),
                    vocab_size: vocab,
                }),
                None => Ok(()),
            };
            check(&r.prompt, "prompt")?;
            check(&r.stop_token_ids, "stop_token_ids")?;
            let end = (r.prompt.len() as u128) + (r.max_new_tokens as u128);
            if end > u128::from(MAX_POSITION) {
                return Err(Error::too_large(
                    format!("requests[{i}]: prompt + max_new_tokens"),
                    end,
                    MAX_POSITION,
                    " positions",
                ));
            }
        }
        let b = requests.len();
        Ok(Self {
            target,
            options,
            requests,
            capture,
            vocab,
            cache: target.new_cache(b)?,
            out: vec![Vec::new(); b],
            done: requests.iter().map(|r| r.max_new_tokens == 0).collect(),
            prefilled: vec![false; b],
            lengths: requests.iter().map(|r| r.prompt.len()).collect(),
            anchors: vec![0; b],
            shown: vec![0; b],
            stale: vec![None; b],
            since_draft: 0,
            refresh_after: 1,
            predicted: Vec::new(),
            pending: vec![(0, Vec::new()); b],
            stats: Stats::default(),
        })
    }

    pub(crate) fn any_active(&self) -> bool {
        self.done.iter().any(|d| !d)
    }

    pub(crate) fn active(&self) -> Vec<usize> {
        (0..self.done.len()).filter(|&i| !self.done[i]).collect()
    }

    pub(crate) fn budget_left(&self, i: usize) -> usize {
        self.requests[i]
            .max_new_tokens
            .saturating_sub(self.out[i].len())
    }

    /// Request `i`'s seed for `what` at its current position.
    pub(crate) fn seed(&self, i: usize, what: Use) -> u64 {
        let (seed, index) = match self.requests[i].seed {
            Some(s) => (s, 0),
            None => (self.options.seed, i as u64),
        };
        derive_seed(seed, index, self.lengths[i] as u64, what as u64)
    }

    pub(crate) fn verify_options(
        &self,
        seeds: Vec<u64>,
        num_draft: Option<Vec<usize>>,
    ) -> VerifyOptions {
        VerifyOptions {
            temperature: PerRequest::All(self.options.temperature),
            top_k: PerRequest::All(self.options.top_k),
            top_p: PerRequest::All(self.options.top_p),
            seeds: Seeds::PerRequest(seeds),
            num_draft,
            // Each request's own stop ids end it in `push` (the kernel's shared list would end
            // a request's round at a batch mate's stop id and move its seeds).
            stop_token_ids: Vec::new(),
        }
    }

    pub(crate) fn forward(
        &mut self,
        ids: &[u32],
        width: usize,
        num: &[usize],
        rows: LogitRows,
    ) -> Result<TargetOutput> {
        let input = TargetInput {
            tokens: ids,
            width,
            num_tokens: num,
            logits: rows,
        };
        let out = self.target.forward(&mut self.cache, &input, self.capture)?;
        out.check(
            &input,
            self.vocab,
            self.capture.len() * self.target.hidden_size(),
        )?;
        Ok(out)
    }

    /// Run every active prompt through the target and sample each request's first token.
    pub(crate) fn prefill(&mut self) -> Result<TargetOutput> {
        let act = self.active();
        let b = self.requests.len();
        let width = act.iter().map(|&i| self.lengths[i]).max().unwrap_or(0);
        let mut ids = vec![0u32; b * width];
        let mut num = vec![0usize; b];
        for &i in &act {
            let p = &self.requests[i].prompt;
            ids[i * width..i * width + p.len()].copy_from_slice(p);
            num[i] = p.len();
            self.prefilled[i] = true;
        }
        let t0 = Instant::now();
        let out = self.forward(&ids, width, &num, LogitRows::Last)?;
        let t1 = Instant::now();
        let logits = select_rows(&out.logits, &act, b)?;
        let rows = logits.dims().get(1).copied().unwrap_or(0);
        // `Last`: one row per request; a target that returned every row gives `[B, S, V]`.
        let last = |i: usize| if rows == 1 { 0 } else { self.lengths[i] - 1 };
        let picked = if rows == 1 {
            logits
        } else {
            let per: Result<Vec<Tensor>> = act
                .iter()
                .enumerate()
                .map(|(j, &i)| Ok(logits.get(j)?.narrow(0, last(i), 1)?))
                .collect();
            Tensor::stack(&per?, 0)?
        };
        let seeds = act.iter().map(|&i| self.seed(i, Use::Prefill)).collect();
        let options = self.verify_options(seeds, None);
        let v = verify_where(&picked, self.vocab, Vec::new(), 0, None, &options)?;
        for (j, &i) in act.iter().enumerate() {
            let t = v.emitted(j).first().copied().unwrap_or(0);
            self.anchors[i] = t as u32;
            self.push(i, &[t as u32]);
        }
        self.stats.target_seconds += (t1 - t0).as_secs_f64();
        self.stats.kernel_seconds += t1.elapsed().as_secs_f64();
        Ok(out)
    }

    /// Append `tokens` to request `i` until its budget or one of its stop ids ends it.
    /// Returns how many were kept.
    pub(crate) fn push(&mut self, i: usize, tokens: &[u32]) -> usize {
        for (n, &t) in tokens.iter().enumerate() {
            self.out[i].push(t);
            if self.requests[i].stop_token_ids.contains(&t)
                || self.out[i].len() >= self.requests[i].max_new_tokens
            {
                self.done[i] = true;
                return n + 1;
            }
        }
        tokens.len()
    }

    /// Commit a verification of the active requests `act` (`lens`: drafts verified each);
    /// returns the tokens each kept (a stop token or the budget may cut a round short).
    pub(crate) fn commit_round(
        &mut self,
        act: &[usize],
        lens: &[usize],
        v: &Verification,
    ) -> Vec<usize> {
        let mut kept_all = Vec::with_capacity(act.len());
        for (j, &i) in act.iter().enumerate() {
            let committed: Vec<u32> = v.emitted(j).iter().map(|&t| t as u32).collect();
            if let Some(&last) = committed.last() {
                self.anchors[i] = last;
            }
            // A stop token or the budget may cut the round short: count what was kept.
            let kept = self.push(i, &committed);
            let accepted = (v.num_accepted[j] as usize).min(kept);
            self.stats.record(lens[j], accepted, kept);
            kept_all.push(kept);
        }
        kept_all
    }

    /// One target-only step of the active requests `act`: each anchor through the target, the
    /// next token drawn on target-only's seeds and committed. Returns the forward's output,
    /// the tokens each request kept and the seconds the forward took; `lengths` is the
    /// caller's to advance (by one: the cache took the anchor).
    pub(crate) fn step(&mut self, act: &[usize]) -> Result<(TargetOutput, Vec<usize>, f64)> {
        let b = self.requests.len();
        let mut ids = vec![0u32; b];
        let mut num = vec![0usize; b];
        for &i in act {
            ids[i] = self.anchors[i];
            num[i] = 1;
        }
        let t = Instant::now();
        let out = self.forward(&ids, 1, &num, LogitRows::All)?;
        let forward = t.elapsed().as_secs_f64();
        let logits = select_rows(&out.logits, act, b)?;
        let seeds = act.iter().map(|&i| self.seed(i, Use::Verify)).collect();
        let options = self.verify_options(seeds, None);
        let v = verify_where(&logits, self.vocab, Vec::new(), 0, None, &options)?;
        let kept = self.commit_round(act, &vec![0; act.len()], &v);
        Ok((out, kept, forward))
    }

    /// Call the streaming hook (if any) with what is new; returns the seconds spent in it.
    pub(crate) fn report(&mut self, hook: &mut Option<OnRound<'_>>) -> Result<f64> {
        let Some(f) = hook.as_mut() else {
            return Ok(0.0);
        };
        let t = Instant::now();
        let update = RoundUpdate {
            round: self.stats.rounds,
            new_tokens: self
                .out
                .iter()
                .zip(&self.shown)
                .map(|(o, &s)| &o[s..])
                .collect(),
            finished: &self.done,
        };
        f(&update)?;
        for (s, o) in self.shown.iter_mut().zip(&self.out) {
            *s = o.len();
        }
        Ok(t.elapsed().as_secs_f64())
    }
}

/// Rows `act` of a `[B, ..]` tensor (the tensor itself when every row is active).
pub(crate) fn select_rows(t: &Tensor, act: &[usize], b: usize) -> Result<Tensor> {
    if t.dims().first() != Some(&b) {
        return Err(Error::bad_shape(
            "target.forward",
            format!("returned logits of shape {:?} for a batch of {b}", t.dims()),
        ));
    }
    if act.len() == b {
        return Ok(t.clone());
    }
    let idx: Vec<u32> = act.iter().map(|&i| i as u32).collect();
    let idx = Tensor::from_vec(idx, act.len(), t.device())?;
    Ok(t.index_select(&idx, 0)?)
}

/// Verify `drafts` (`[B, k]` ids, row-major) against `logits` `[B, k + 1, V]` where the
/// logits are: on a device (or under the forced tensor path) with the tensor-path kernel, the
/// drafts and the `[B, k, V]` draft logits `q` going to them (a device drafter's are there
/// already) and only the verdicts coming back; on the host with the slice kernel over the
/// logits in place.
pub(crate) fn verify_where(
    logits: &Tensor,
    vocab: usize,
    drafts: Vec<i64>,
    k: usize,
    q: Option<Tensor>,
    options: &VerifyOptions,
) -> Result<Verification> {
    let b = logits.dims().first().copied().unwrap_or(0);
    let q_ok = q.as_ref().is_none_or(|q| q.dims() == [b, k, vocab]);
    if logits.dims() != [b, k + 1, vocab] || drafts.len() != b * k || !q_ok {
        return Err(Error::bad_shape(
            "target.forward",
            format!(
                "logits of shape {:?} (draft logits {:?}) for {} drafts in rows of {k} over a \
                 vocabulary of {vocab}",
                logits.dims(),
                q.as_ref().map(Tensor::dims),
                drafts.len()
            ),
        ));
    }
    if use_tensor_path(logits.device())? {
        let dev = logits.device();
        let drafts = Tensor::from_vec(drafts, (b, k), dev)?;
        let q = match q {
            Some(q) => Some(q.to_device(dev)?),
            None => None,
        };
        return verify(logits, &drafts, q.as_ref(), options);
    }
    let host = |q: Option<Floats<'_>>| {
        with_floats(logits, |p| {
            verify_slices(
                Rows3 {
                    data: p,
                    dims: [b, k + 1, vocab],
                },
                Tokens {
                    data: &drafts,
                    dims: [b, k],
                },
                q.map(|q| Rows3 {
                    data: q,
                    dims: [b, k, vocab],
                }),
                options,
            )
        })?
    };
    match q {
        None => host(None),
        Some(q) => with_floats(&q, |q| host(Some(q)))?,
    }
}

/// Run `f` over the values of `t` as host floats: borrowed when `t` is a contiguous f32 / f16
/// / bf16 CPU tensor, else copied to the host as f32 once.
pub(crate) fn with_floats<R>(t: &Tensor, f: impl FnOnce(Floats<'_>) -> R) -> Result<R> {
    let t = if t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        t.clone()
    } else {
        t.to_dtype(DType::F32)?.to_device(&Device::Cpu)?
    };
    let (storage, layout) = t.storage_and_layout();
    let Some((lo, hi)) = layout.contiguous_offsets() else {
        drop(storage);
        let c = t.contiguous()?;
        return with_floats(&c, f);
    };
    Ok(match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => f(Floats::F32(&v[lo..hi])),
        Storage::Cpu(CpuStorage::F16(v)) => f(Floats::F16(&v[lo..hi])),
        Storage::Cpu(CpuStorage::BF16(v)) => f(Floats::BF16(&v[lo..hi])),
        _ => {
            return Err(Error::Internal {
                message: "host floats: unexpected storage after conversion".into(),
            });
        }
    })
}
