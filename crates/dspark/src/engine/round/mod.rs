//! One round: the running requests' drafted blocks and the joining requests' prefills go
//! through the target (in one forward where the target is ragged), the blocks are verified and
//! committed, caches roll back to what was kept and drafter contexts take the new features.

mod commit;
mod constrain;
mod logprobs;
mod penalize;
mod plan;
mod propose;
mod verify;

pub use commit::{PENDING_BYTES, PENDING_CAP};

use std::time::Instant;

use candle_core::Tensor;

use crate::drafter::Drafter;
use crate::engine::engine::Engine;
use crate::engine::output::{RequestOutput, StepOutput};
use crate::engine::seeds::{Use, request_seed};
use crate::error::Result;
use crate::models::{LogitRows, TargetInput, TargetModel, TargetOutput};
use crate::sampling::{PerRequest, Seeds, Verification, VerifyOptions};
use logprobs::row_logprobs;
use penalize::Positions;
use verify::{select_rows, verify_isolating};

/// What a round does for its running requests (module `plan` builds it).
pub(super) struct Plan {
    /// The running rows, in row order.
    pub(super) act: Vec<usize>,
    /// Drafts verified per request of `act`.
    pub(super) lens: Vec<usize>,
    /// Per request of `act`: its drafted tokens (at least `lens[j]`; empty without drafting).
    pub(super) drafts: Vec<Vec<u32>>,
    /// `[A, kmax, V_t]` draft logits (where the drafter left them) when a request of `act`
    /// samples; rows of requests that did not draft are never read.
    pub(super) q: Option<Tensor>,
    /// Per request of `act`: its block's confidences, when it drafted with a head.
    pub(super) confidence: Vec<Option<Vec<f32>>>,
    /// Per request of `act`: whether it proposed this round.
    pub(super) drafted: Vec<bool>,
    /// The scheduling policy chose a round without drafts for every request.
    pub(super) plain: bool,
    /// The scheduling policy chose a probe: one request drafts, to learn (its costs price no
    /// round of either kind).
    pub(super) probe: bool,
    /// The round was a refresh (a probe's, or a lone request's whole round): its time outside
    /// the forward prices the next refreshes.
    pub(super) explored: bool,
    /// Seconds proposing (without appending the pending features first: that is the cost of
    /// switching back from plain rounds, not of drafting).
    pub(super) propose_seconds: f64,
    /// Seconds appending the pending features before proposing (a probe's price includes
    /// them).
    pub(super) flush_seconds: f64,
}

impl Plan {
    /// The widest block verified.
    fn kmax(&self) -> usize {
        self.lens.iter().copied().max().unwrap_or(0)
    }
}

/// The sampling options of a verification of `rows` (seeds for `what` at each row's position).
pub(super) struct RowSampling {
    pub(super) temperature: Vec<f32>,
    pub(super) top_k: Vec<Option<usize>>,
    pub(super) top_p: Vec<f32>,
    pub(super) seeds: Vec<u64>,
}

impl RowSampling {
    fn options(self, num_draft: Option<Vec<usize>>) -> VerifyOptions {
        VerifyOptions {
            temperature: PerRequest::Each(self.temperature),
            top_k: PerRequest::Each(self.top_k),
            top_p: PerRequest::Each(self.top_p),
            seeds: Seeds::PerRequest(self.seeds),
            num_draft,
            // Each request's own stop ids end it when its tokens are committed (the kernel's
            // shared list would end a request's round at a batch mate's stop id).
            stop_token_ids: Vec::new(),
        }
    }
}

impl<T: TargetModel, D: Drafter> Engine<T, D> {
    /// The sampling of rows `rows` for `what`, each at its cache position `at(row)`.
    pub(super) fn sampling(
        &self,
        rows: &[usize],
        what: Use,
        at: impl Fn(usize) -> usize,
    ) -> RowSampling {
        let mut s = RowSampling {
            temperature: Vec::with_capacity(rows.len()),
            top_k: Vec::with_capacity(rows.len()),
            top_p: Vec::with_capacity(rows.len()),
            seeds: Vec::with_capacity(rows.len()),
        };
        for &i in rows {
            if let Some(slot) = &self.sched.rows[i] {
                let p = slot.spec.sampling;
                s.temperature.push(p.temperature);
                s.top_k.push(p.top_k);
                s.top_p.push(p.top_p);
                s.seeds.push(request_seed(slot.spec.seed, at(i), what));
            }
        }
        s
    }

    /// Row `i`'s log-probabilities of `tokens` at positions `0..` of `logits` (`[B, W, V]`, row
    /// `i`), or of `own` (`[1, n, V]`, [`Engine::logprob_rows`]) where it has them, when its
    /// request asked for them (none otherwise).
    fn logprobs_of(
        &self,
        i: usize,
        logits: &Tensor,
        own: Option<&Tensor>,
        tokens: &[u32],
    ) -> Result<Vec<crate::sampling::TokenLogprob>> {
        let (logits, row) = match own {
            Some(t) => (t, 0),
            None => (logits, i),
        };
        match &self.sched.rows[i] {
            Some(s) if s.error.is_none() => match s.spec.logprobs {
                Some(top) => row_logprobs(logits, row, 0, tokens, s.spec.sampling, top),
                None => Ok(Vec::new()),
            },
            _ => Ok(Vec::new()),
        }
    }

    /// One target forward (checked like every target's output), timed into `out`.
    fn run_forward(
        &mut self,
        ids: &[u32],
        width: usize,
        num: &[usize],
        rows: LogitRows<'_>,
        out: &mut StepOutput,
    ) -> Result<TargetOutput> {
        let input = TargetInput {
            tokens: ids,
            width,
            num_tokens: num,
            logits: rows,
        };
        let capture = self.drafter.info().capture_layer_ids.as_slice();
        let width_h = capture.len() * self.target.hidden_size();
        let t = Instant::now();
        let Some(cache) = self.cache.as_mut() else {
            return Err(crate::error::Error::Internal {
                message: "a round without a target cache".into(),
            });
        };
        let result = self.target.forward(cache, &input, capture)?;
        let seconds = t.elapsed().as_secs_f64();
        out.timing.target_seconds += seconds;
        result.check(&input, self.target.vocab_size(), width_h)?;
        self.planner.observe_forward(num.iter().sum(), seconds);
        Ok(result)
    }

    /// The round of this step (see the module docs).
    pub(super) fn round(&mut self, out: &mut StepOutput) -> Result<()> {
        let b = self.sched.rows.len();
        let (mut act, mut join) = (Vec::new(), Vec::new());
        for (i, row) in self.sched.rows.iter().enumerate() {
            match row {
                Some(s) if s.joining.is_some() => join.push(i),
                Some(_) => act.push(i),
                None => {}
            }
        }
        let mut plan = if act.is_empty() {
            None
        } else {
            Some(self.plan_round(act.clone(), out)?)
        };
        // A joining row samples its first token unless it resumes (it has one already).
        let sample_first: Vec<bool> = (0..b)
            .map(|i| {
                self.sched.rows[i]
                    .as_ref()
                    .is_some_and(|s| s.joining.is_some() && !s.resumed)
            })
            .collect();
        let first_rows: Vec<usize> = join.iter().copied().filter(|&i| sample_first[i]).collect();
        let mut masks = self.constrain(plan.as_mut(), &first_rows);
        // The forward(s): each running row its anchor and verified drafts, each joining row
        // its prefill.
        let block = |j: usize, p: &Plan| -> Vec<u32> {
            let slot = self.sched.rows[p.act[j]].as_ref();
            let mut t = vec![slot.map_or(0, |s| s.anchor)];
            t.extend_from_slice(&p.drafts[j][..p.lens[j]]);
            t
        };
        let mut row_tokens: Vec<Vec<u32>> = vec![Vec::new(); b];
        if let Some(p) = &plan {
            for (j, &i) in p.act.iter().enumerate() {
                row_tokens[i] = block(j, p);
            }
        }
        for &i in &join {
            row_tokens[i] = self.sched.rows[i]
                .as_ref()
                .and_then(|s| s.joining.clone())
                .unwrap_or_default();
        }
        let (round_out, join_out) = if act.is_empty() {
            let o = self.forward_rows(&row_tokens, &join, LogitRows::Last, out)?;
            (None, Some(o))
        } else if join.is_empty() {
            let o = self.forward_rows(&row_tokens, &act, LogitRows::All, out)?;
            (Some(o), None)
        } else if self.target.ragged() {
            let tails: Vec<usize> = (0..b)
                .map(|i| {
                    if join.contains(&i) {
                        usize::from(sample_first[i])
                    } else {
                        row_tokens[i].len()
                    }
                })
                .collect();
            let all: Vec<usize> = (0..b).filter(|i| self.sched.rows[*i].is_some()).collect();
            let o = self.forward_rows(&row_tokens, &all, LogitRows::Tail(&tails), out)?;
            (Some(o.clone()), Some(o))
        } else {
            // A padded target: the prefills run on their own (the round's rows are short).
            let r = self.forward_rows(&row_tokens, &act, LogitRows::All, out)?;
            let j = self.forward_rows(&row_tokens, &join, LogitRows::Last, out)?;
            (Some(r), Some(j))
        };
        let t_kernels = Instant::now();
        let mut drafter_seconds = 0.0;
        let mut new_tokens: Vec<Vec<u32>> = vec![Vec::new(); b];
        let mut kept = vec![0usize; b];
        let mut accepted = vec![0usize; b];
        let mut logprobs: Vec<Vec<crate::sampling::TokenLogprob>> = vec![Vec::new(); b];
        if let (Some(p), Some(o)) = (&mut plan, &round_out) {
            let positions: Vec<Positions<'_>> = p
                .act
                .iter()
                .enumerate()
                .map(|(j, &i)| Positions {
                    row: i,
                    n: p.lens[j] + 1,
                    before: &p.drafts[j][..p.lens[j]],
                })
                .collect();
            let logits = self.penalized(&o.logits, &positions)?;
            drop(positions);
            // Lazy rows find their sets here (and may verify fewer drafts).
            let act = p.act.clone();
            self.resolve_masks(&logits, &mut masks, &act, Some(&mut *p))?;
            let p = &*p;
            let logits = self.masked(&logits, &masks)?;
            let (verification, faults) = self.verify_round(p, &logits, b)?;
            for (j, &i) in p.act.iter().enumerate() {
                if let Some(e) = &faults[j] {
                    // Its own rows failed: it ends alone, keeping nothing of this round.
                    self.fail_row(i, e);
                    continue;
                }
                if self.sched.rows[i]
                    .as_ref()
                    .is_some_and(|s| s.error.is_some() || s.finish.is_some())
                {
                    // It failed proposing, or its grammar ended it: nothing of this round is
                    // kept.
                    continue;
                }
                let c = self.commit(j, p, &verification, out);
                let own = self.logprob_rows(i, &logits, &c.tokens)?;
                self.advance(i, &c.tokens);
                logprobs[i] = self.logprobs_of(i, &logits, own.as_ref(), &c.tokens)?;
                new_tokens[i] = c.tokens;
                kept[i] = c.kept;
                accepted[i] = c.accepted;
            }
        }
        let mut first = vec![None; b];
        if let Some(o) = &join_out {
            let rows: Vec<usize> = join
                .iter()
                .copied()
                .filter(|&i| {
                    sample_first[i]
                        && self.sched.rows[i]
                            .as_ref()
                            .is_some_and(|s| s.finish.is_none())
                })
                .collect();
            let penalized = if rows.is_empty() {
                None
            } else {
                let positions: Vec<Positions<'_>> = rows
                    .iter()
                    .map(|&i| Positions {
                        row: i,
                        n: 1,
                        before: &[],
                    })
                    .collect();
                let all = self.penalized(&o.logits, &positions)?;
                drop(positions);
                self.resolve_masks(&all, &mut masks, &rows, None)?;
                Some(all)
            };
            // A lazy row whose grammar allows nothing has ended: it samples nothing.
            let rows: Vec<usize> = rows
                .into_iter()
                .filter(|&i| {
                    self.sched.rows[i]
                        .as_ref()
                        .is_some_and(|s| s.finish.is_none())
                })
                .collect();
            if let Some(all) = penalized
                && !rows.is_empty()
            {
                let all = self.masked(&all, &masks)?;
                let logits = select_rows(&all, &rows, b)?;
                let last = logits.narrow(1, 0, 1)?;
                let options = self
                    .sampling(&rows, Use::Prefill, |i| row_tokens[i].len())
                    .options(None);
                let (v, faults) = verify_isolating(
                    &last,
                    self.target.vocab_size(),
                    Vec::new(),
                    0,
                    None,
                    &options,
                )?;
                for (j, &i) in rows.iter().enumerate() {
                    match &faults[j] {
                        None => {
                            let t = v.emitted(j).first().copied().unwrap_or(0) as u32;
                            first[i] = Some(t);
                            let own = self.logprob_rows(i, &all, &[t])?;
                            self.advance(i, &[t]);
                            logprobs[i] = self.logprobs_of(i, &all, own.as_ref(), &[t])?;
                        }
                        Some(e) => self.fail_row(i, e),
                    }
                }
            }
        }
        // Roll the cache back to what each row keeps: a round's row its old length plus the
        // tokens it kept but the last (the next anchor), a joining row its prefill.
        let mut lengths = match self.cache.as_ref() {
            Some(c) => self.target.cache_lengths(c),
            None => vec![0; b],
        };
        if let Some(p) = &plan {
            for &i in &p.act {
                if let Some(s) = &self.sched.rows[i] {
                    lengths[i] = s.len + kept[i];
                }
            }
        }
        for &i in &join {
            lengths[i] = row_tokens[i].len();
        }
        if let Some(cache) = self.cache.as_mut() {
            self.target.truncate(cache, &lengths)?;
        }
        let t_extend = Instant::now();
        if let (Some(p), Some(o)) = (&plan, &round_out) {
            drafter_seconds += self.extend_round(p, o, &kept)?;
        }
        if let Some(o) = &join_out {
            drafter_seconds += self.extend_joining(&join, o, &row_tokens)?;
        }
        let t_done = Instant::now();
        for &i in &join {
            let Some(slot) = self.sched.rows[i].as_mut() else {
                continue;
            };
            slot.len = row_tokens[i].len();
            slot.joining = None;
            if let Some(t) = first[i] {
                slot.anchor = t;
                slot.push(&[t]);
                new_tokens[i] = vec![t];
                self.metrics.generation_tokens += 1;
            }
        }
        if let Some(p) = &plan {
            for &i in &p.act {
                if let Some(s) = self.sched.rows[i].as_mut() {
                    s.len += kept[i];
                }
            }
        }
        for &i in act.iter().chain(&join) {
            let Some(slot) = &self.sched.rows[i] else {
                continue;
            };
            let j = plan
                .as_ref()
                .and_then(|p| p.act.iter().position(|&r| r == i));
            out.outputs.push(RequestOutput {
                id: slot.id,
                new_tokens: std::mem::take(&mut new_tokens[i]),
                logprobs: std::mem::take(&mut logprobs[i]),
                drafted: j
                    .and_then(|j| plan.as_ref().map(|p| p.lens[j]))
                    .unwrap_or(0),
                accepted: accepted[i],
                finish: None,
                usage: slot.usage,
                error: None,
            });
        }
        let kernels = (t_extend - t_kernels).as_secs_f64() + (t_done - t_extend).as_secs_f64()
            - drafter_seconds;
        out.timing.drafter_seconds += drafter_seconds;
        out.timing.kernel_seconds += kernels.max(0.0);
        if let Some(p) = &plan {
            out.round = true;
            out.plain = p.plain;
            let after = t_kernels.elapsed().as_secs_f64();
            let proposers = p.drafted.iter().filter(|&&d| d).count();
            if proposers > 0 {
                self.planner.observe_proposal(proposers, p.propose_seconds);
            }
            if p.probe || p.explored {
                let outside = p.flush_seconds + p.propose_seconds + after;
                self.planner.observe_probe(p.act.len(), outside);
            }
            self.planner.observe_round(
                p.act.len(),
                p.plain,
                !p.probe && p.drafted.iter().any(|&d| d),
                p.propose_seconds,
                after - drafter_seconds,
                drafter_seconds,
            );
        }
        Ok(())
    }

    /// A forward of `rows` (each its tokens in `row_tokens`, every other row none).
    fn forward_rows(
        &mut self,
        row_tokens: &[Vec<u32>],
        rows: &[usize],
        logits: LogitRows<'_>,
        out: &mut StepOutput,
    ) -> Result<TargetOutput> {
        let b = row_tokens.len();
        let width = rows.iter().map(|&i| row_tokens[i].len()).max().unwrap_or(0);
        let mut ids = vec![0u32; b * width];
        let mut num = vec![0usize; b];
        for &i in rows {
            let t = &row_tokens[i];
            ids[i * width..i * width + t.len()].copy_from_slice(t);
            num[i] = t.len();
        }
        self.run_forward(&ids, width, &num, logits, out)
    }

    /// Verify the round's blocks against the target's logits; a request whose own rows fail
    /// their checks gets its error in the second list ([`verify_isolating`]).
    fn verify_round(
        &self,
        p: &Plan,
        logits: &Tensor,
        b: usize,
    ) -> Result<(Verification, Vec<Option<crate::error::Error>>)> {
        let kmax = p.kmax();
        let logits = select_rows(logits, &p.act, b)?;
        let logits = if logits.dims().get(1) == Some(&(kmax + 1)) {
            logits
        } else {
            logits.narrow(1, 0, kmax + 1)?
        };
        let mut drafts = Vec::with_capacity(p.act.len() * kmax);
        for (j, d) in p.drafts.iter().enumerate() {
            let n = p.lens[j];
            drafts.extend(d[..n].iter().map(|&t| i64::from(t)));
            drafts.extend(std::iter::repeat_n(0, kmax - n));
        }
        let samples = p.act.iter().any(|&i| {
            self.sched.rows[i]
                .as_ref()
                .is_some_and(|s| !s.spec.sampling.is_greedy())
        });
        let q = match (&p.q, samples && kmax > 0) {
            (Some(q), true) => Some(if q.dims().get(1) == Some(&kmax) {
                q.clone()
            } else {
                q.narrow(1, 0, kmax)?
            }),
            _ => None,
        };
        let options = self
            .sampling(&p.act, Use::Verify, |i| {
                self.sched.rows[i].as_ref().map_or(0, |s| s.len)
            })
            .options(Some(p.lens.clone()));
        verify_isolating(&logits, self.target.vocab_size(), drafts, kmax, q, &options)
    }
}
