//! [`Speculator`]: the round loop (see the module docs of [`crate::speculator`]).

use std::sync::Mutex;
use std::time::Instant;

use candle_core::{Device, Tensor};

use super::drafting::{expected_acceptance, recalibrated, unit};
use super::observed::{Costs, ForwardTimes, RoundCosts};
use super::options::{Request, SpeculatorOptions, Use, VerifyPolicy};
use super::profile::{MAX_PROFILE_TOKENS, measure_steps_per_second};
use super::state::{Run, select_rows, verify_where};
use super::stats::ConfidenceRecord;
use super::target::{LogitRows, TargetModel};
use super::{Generation, OnRound};
use crate::drafter::{Drafter, ProposeOptions};
use crate::error::{Error, Result};
use crate::sampling::Seeds;
use crate::schedule::{
    StepsPerSecond, schedule_lengths_ahead, schedule_pipelined, threshold_lengths,
};

/// Speculative decoding of a [`TargetModel`] with a [`Drafter`].
#[derive(Debug)]
pub struct Speculator<T: TargetModel, D: Drafter> {
    target: T,
    drafter: D,
    options: SpeculatorOptions,
    /// Drafts verified per round at most.
    num_speculative: usize,
    /// What the scheduling policies price rounds with, kept across calls.
    observed: Mutex<Observed>,
}

/// What the scheduling policies learn while serving (module `observed`): the measured table
/// (profiled up to `max tokens` at first use, refined by the forwards the rounds time) and the
/// costs of a round outside the forward.
#[derive(Debug, Default)]
struct Observed {
    profile: Option<(usize, StepsPerSecond)>,
    times: ForwardTimes,
    costs: RoundCosts,
}

fn mismatch(message: String) -> Error {
    Error::TargetMismatch { message }
}

/// Check the sampling options shared by both decoders.
pub(crate) fn check_sampling(o: &SpeculatorOptions) -> Result<()> {
    if !(o.temperature.is_finite() && o.temperature >= 0.0) {
        return Err(Error::invalid(
            "temperature",
            format!("{}: must be finite and >= 0", o.temperature),
        ));
    }
    if o.top_k == Some(0) {
        return Err(Error::invalid("top_k", "0: must be >= 1 (or off)"));
    }
    if !(o.top_p > 0.0 && o.top_p <= 1.0) {
        return Err(Error::invalid(
            "top_p",
            format!("{}: must be in (0, 1]", o.top_p),
        ));
    }
    Ok(())
}

impl<T: TargetModel, D: Drafter> Speculator<T, D> {
    /// Check the pair (capture layers, feature width, vocabulary) and the options; nothing
    /// runs yet. Errors: `target-mismatch`, `invalid-argument`, `bad-config` (a confidence
    /// policy for a drafter without a confidence head).
    pub fn new(target: T, drafter: D, options: SpeculatorOptions) -> Result<Self> {
        let layers = target.num_hidden_layers();
        for &c in drafter.capture_layer_ids() {
            if c >= layers {
                return Err(mismatch(format!(
                    "drafter target layer id {} (capture id {c}) does not fit a {layers}-layer \
                     target (DeepSpec ids -1..={})",
                    c as i64 - 1,
                    layers as i64 - 2
                )));
            }
        }
        let width = drafter.capture_layer_ids().len() * target.hidden_size();
        if drafter.context_width() != width {
            return Err(mismatch(format!(
                "drafter fuses context features of width {}, the target gives {} layers × \
                 hidden_size {} = {width}",
                drafter.context_width(),
                drafter.capture_layer_ids().len(),
                target.hidden_size()
            )));
        }
        if drafter.vocab().target != target.vocab_size() {
            return Err(mismatch(format!(
                "drafter target vocab {} != target vocab {}",
                drafter.vocab().target,
                target.vocab_size()
            )));
        }
        let k = drafter.num_draft_tokens();
        let n = options.num_speculative_tokens.unwrap_or(k);
        if n > k {
            return Err(Error::invalid(
                "num_speculative_tokens",
                format!("{n}: must be in [0, {k}] (the drafter's block)"),
            ));
        }
        check_sampling(&options)?;
        match &options.verify {
            VerifyPolicy::Full => {}
            VerifyPolicy::Threshold(t) if !(0.0..=1.0).contains(t) => {
                return Err(Error::invalid(
                    "verify",
                    format!("threshold {t}: must be in [0, 1]"),
                ));
            }
            policy if !drafter.has_confidence_head() => {
                return Err(Error::bad_config(
                    "<drafter>",
                    "enable_confidence_head",
                    format!("verify={} needs a confidence head", policy.name()),
                ));
            }
            _ => {}
        }
        Ok(Self {
            target,
            drafter,
            options,
            num_speculative: n,
            observed: Mutex::new(Observed::default()),
        })
    }

    /// The target model.
    pub fn target(&self) -> &T {
        &self.target
    }

    /// The drafter.
    pub fn drafter(&self) -> &D {
        &self.drafter
    }

    /// The options.
    pub fn options(&self) -> &SpeculatorOptions {
        &self.options
    }

    /// Drafts verified per round at most.
    pub fn num_speculative_tokens(&self) -> usize {
        self.num_speculative
    }

    /// The steps-per-second table measured on the target, at least up to `tokens` verified
    /// tokens (profiled on first use, again when a larger batch needs more), refined by the
    /// forwards observed since (module `observed`).
    fn measured_table(&self, tokens: usize, row_tokens: usize) -> Result<StepsPerSecond> {
        // Past MAX_PROFILE_TOKENS the table holds tokens/s constant: a huge batch's first
        // round must not wait on a profile of its whole size.
        let tokens = tokens.min(MAX_PROFILE_TOKENS.max(row_tokens));
        let mut slot = self.observed()?;
        let profile = match &slot.profile {
            Some((max, table)) if *max >= tokens => table.clone(),
            _ => {
                let want = tokens.max(slot.profile.as_ref().map_or(0, |s| s.0));
                let table = measure_steps_per_second(&self.target, want, row_tokens)?;
                slot.profile = Some((want, table.clone()));
                table
            }
        };
        slot.times.refine(&profile)
    }

    /// The table [`VerifyPolicy::ScheduledMeasured`] uses, once measured: the profile refined
    /// by the forwards observed so far.
    pub fn measured_steps_per_second(&self) -> Option<StepsPerSecond> {
        let slot = self.observed.lock().ok()?;
        let (_, profile) = slot.profile.as_ref()?;
        slot.times.refine(profile).ok()
    }

    fn observed(&self) -> Result<std::sync::MutexGuard<'_, Observed>> {
        self.observed.lock().map_err(|_| Error::Internal {
            message: "the speculator's observed costs' lock is poisoned".into(),
        })
    }

    /// Whether the policy schedules (and so learns from what rounds cost).
    fn schedules(&self) -> bool {
        matches!(
            self.options.verify,
            VerifyPolicy::Scheduled(_)
                | VerifyPolicy::ScheduledMeasured
                | VerifyPolicy::Pipelined(_)
        )
    }

    /// Time one round's target forward over `tokens` total tokens into the measured table
    /// (only under [`VerifyPolicy::ScheduledMeasured`]).
    pub(super) fn observe_forward(&self, tokens: usize, seconds: f64) -> Result<()> {
        if matches!(self.options.verify, VerifyPolicy::ScheduledMeasured) {
            self.observed()?.times.record(tokens, seconds);
        }
        Ok(())
    }

    /// Keep what a round of `batch` requests spent outside its forward: `propose` seconds
    /// proposing (`None`: a plain round) and `rest` seconds besides (under a scheduling policy).
    pub(super) fn observe_round(
        &self,
        batch: usize,
        propose: Option<f64>,
        rest: f64,
    ) -> Result<()> {
        if self.schedules() {
            let costs = &mut self.observed()?.costs;
            match propose {
                Some(p) => costs.record_drafted(batch, p, rest),
                None => costs.record_plain(batch, rest),
            }
        }
        Ok(())
    }

    /// Keep what appending `rows` pending plain-round features cost before a drafted round of
    /// `batch` requests (under a scheduling policy).
    pub(super) fn observe_flush(&self, batch: usize, rows: usize, seconds: f64) -> Result<()> {
        if self.schedules() {
            self.observed()?.costs.record_flush(batch, rows, seconds);
        }
        Ok(())
    }

    /// Per-request costs of a round of `batch` requests outside the forward, from what the
    /// rounds of this speculator observed (`None` before a drafted round was timed).
    pub(super) fn round_costs(&self, batch: usize) -> Result<Option<Costs>> {
        Ok(self.observed()?.costs.get(batch))
    }

    /// Generate for every request (prompts of any lengths, each its own budget, stop tokens
    /// and seed). `on_round`, if given, is called after the prefill and after every round with
    /// what each request committed since the previous call; its time is not counted in the
    /// stats, and an error it returns aborts the call.
    pub fn generate(
        &self,
        requests: &[Request],
        mut on_round: Option<OnRound<'_>>,
    ) -> Result<Generation> {
        let t0 = Instant::now();
        let mut run = Run::new(
            &self.target,
            &self.options,
            requests,
            self.drafter.capture_layer_ids(),
        )?;
        let mut states = Vec::with_capacity(requests.len());
        for _ in requests {
            states.push(self.drafter.new_state()?);
        }
        let mut hook = 0.0;
        if run.any_active() {
            let out = run.prefill()?;
            let t = Instant::now();
            for (i, state) in states.iter_mut().enumerate() {
                if run.prefilled[i] {
                    let feats = out.hidden_states.get(i)?.narrow(0, 0, run.lengths[i])?;
                    self.drafter.extend(state, &feats, 0)?;
                }
            }
            run.stats.drafter_seconds += t.elapsed().as_secs_f64();
            run.stats.prefill_seconds = t0.elapsed().as_secs_f64();
            hook += run.report(&mut on_round)?;
            while run.any_active() {
                // Decode-sized work: inline on this thread (crate::threads).
                crate::threads::in_round(|| self.round(&mut run, &mut states))?;
                hook += run.report(&mut on_round)?;
            }
        }
        run.stats.total_seconds = t0.elapsed().as_secs_f64() - hook;
        Ok(Generation {
            tokens: run.out,
            stats: run.stats,
        })
    }

    /// One round for every active request.
    fn round(&self, run: &mut Run<'_, T>, states: &mut [D::State]) -> Result<()> {
        let act = run.active();
        // The measured table, once per round (profiled at first use, outside the round's
        // timings, which price the scheduler's table).
        let measured = matches!(self.options.verify, VerifyPolicy::ScheduledMeasured)
            .then(|| {
                let row = self.num_speculative + 1;
                self.measured_table(act.len() * row, row)
            })
            .transpose()?;
        if !self.drafts_this_round(run, &act, measured.as_ref())? {
            return self.plain_round(run, &act);
        }
        let flushed = self.flush_pending(run, states, &act)?;
        let t0 = Instant::now();
        let anchors: Vec<u32> = act.iter().map(|&i| run.anchors[i]).collect();
        let refs: Vec<&D::State> = act.iter().map(|&i| &states[i]).collect();
        let seeds = act
            .iter()
            .map(|&i| run.seed(i, Use::Draft))
            .collect::<Vec<_>>();
        // A device drafter keeps its draft logits where verification will read them.
        let (mut proposal, device_q) = self.drafter.propose_for_verify(
            &refs,
            &anchors,
            &ProposeOptions {
                temperature: self.options.temperature,
                seeds: Seeds::PerRequest(seeds),
                top_k: None,
            },
        )?;
        let k = proposal.slots;
        if let Some(&t) = proposal.tokens.iter().find(|&&t| t as usize >= run.vocab) {
            return Err(Error::TokenOutOfRange {
                name: "drafter.propose".into(),
                id: i64::from(t),
                vocab_size: run.vocab,
            });
        }
        if proposal.batch != act.len() || proposal.tokens.len() != act.len() * k || k == 0 {
            return Err(Error::bad_shape(
                "drafter.propose",
                format!(
                    "returned a [{}, {k}] block for {} requests",
                    proposal.batch,
                    act.len()
                ),
            ));
        }
        let t1 = Instant::now();
        run.since_draft = 0;
        let lens = self.verify_lengths(
            run,
            &act,
            proposal.confidence.as_deref(),
            k,
            measured.as_ref(),
        )?;
        let kmax = lens.iter().copied().max().unwrap_or(0);
        let width = kmax + 1;
        let b = run.requests.len();
        let mut ids = vec![0u32; b * width];
        let mut num = vec![0usize; b];
        let mut drafts = Vec::with_capacity(act.len() * kmax);
        for (j, &i) in act.iter().enumerate() {
            let row = &proposal.tokens[j * k..j * k + kmax];
            ids[i * width] = run.anchors[i];
            ids[i * width + 1..(i + 1) * width].copy_from_slice(row);
            num[i] = lens[j] + 1;
            drafts.extend(row.iter().map(|&t| i64::from(t)));
        }
        let t2 = Instant::now();
        let out = run.forward(&ids, width, &num, LogitRows::All)?;
        let t3 = Instant::now();
        self.observe_forward(num.iter().sum(), (t3 - t2).as_secs_f64())?;
        let logits = select_rows(&out.logits, &act, b)?;
        let v_t = run.vocab;
        // Sampling: the draft logits `[B, K, V_t]` of the first `kmax` slots, where they are.
        let q: Option<Tensor> = (self.options.temperature > 0.0)
            .then(|| {
                let bad =
                    || Error::bad_shape("drafter.propose", "draft logits are not [B, K, V_t]");
                let full = match device_q {
                    Some(t) if t.dims() == [act.len(), k, v_t] => t,
                    Some(_) => return Err(bad()),
                    None if proposal.draft_logits.len() == act.len() * k * v_t => {
                        let host = std::mem::take(&mut proposal.draft_logits);
                        Tensor::from_vec(host, (act.len(), k, v_t), &Device::Cpu)?
                    }
                    None => return Err(bad()),
                };
                Ok(if kmax == k {
                    full
                } else {
                    full.narrow(1, 0, kmax)?
                })
            })
            .transpose()?;
        let seeds = act.iter().map(|&i| run.seed(i, Use::Verify)).collect();
        let options = run.verify_options(seeds, Some(lens.clone()));
        // Where the target left the logits: on a device only the verdicts come back.
        let verification = verify_where(&logits, v_t, drafts, kmax, q, &options)?;
        let t4 = Instant::now();
        if self.options.record_confidence
            && let Some(c) = &proposal.confidence
        {
            for (j, &n) in lens.iter().enumerate() {
                let accepted = verification.num_accepted[j] as usize;
                for slot in 0..(accepted + 1).min(n) {
                    run.stats.confidence_records.push(ConfidenceRecord {
                        position: slot as u32,
                        confidence: c[j * k + slot],
                        accepted: slot < accepted,
                    });
                }
            }
        }
        let kept = run.commit_round(&act, &lens, &verification);
        if let Some(c) = &proposal.confidence {
            // The slots `commit_round` counted as attempts, with what the head predicted.
            for (j, &n) in lens.iter().enumerate() {
                let accepted = (verification.num_accepted[j] as usize).min(kept[j]);
                let slots = (accepted + 1).min(n);
                if run.predicted.len() < slots {
                    run.predicted.resize(slots, 0.0);
                }
                for (slot, sum) in run.predicted.iter_mut().enumerate().take(slots) {
                    *sum += unit(c[j * k + slot]);
                }
            }
        }
        let mut new_lengths = run.target.cache_lengths(&run.cache);
        for (j, &i) in act.iter().enumerate() {
            // The caches hold the anchor and every kept token but the last (the next anchor).
            new_lengths[i] = run.lengths[i] + kept[j];
        }
        run.target.truncate(&mut run.cache, &new_lengths)?;
        let t5 = Instant::now();
        for (j, &i) in act.iter().enumerate() {
            let feats = out.hidden_states.get(i)?.narrow(0, 0, kept[j])?;
            self.drafter
                .extend(&mut states[i], &feats, run.lengths[i])?;
            run.lengths[i] = new_lengths[i];
        }
        let t6 = Instant::now();
        self.observe_round(
            act.len(),
            Some((t1 - t0).as_secs_f64()),
            ((t2 - t1) + (t4 - t3) + (t6 - t4)).as_secs_f64(),
        )?;
        let st = &mut run.stats;
        st.rounds += 1;
        st.drafter_seconds += (t1 - t0).as_secs_f64() + (t6 - t5).as_secs_f64() + flushed;
        st.target_seconds += (t3 - t2).as_secs_f64();
        st.kernel_seconds += ((t2 - t1) + (t4 - t3) + (t5 - t4)).as_secs_f64();
        Ok(())
    }

    /// Drafts to verify per active request: the policy's choice, capped by the budget (a round
    /// commits at most drafts + 1 tokens). `measured`: this round's measured table (under
    /// [`VerifyPolicy::ScheduledMeasured`]).
    fn verify_lengths(
        &self,
        run: &mut Run<'_, T>,
        act: &[usize],
        confidence: Option<&[f32]>,
        k: usize,
        measured: Option<&StepsPerSecond>,
    ) -> Result<Vec<usize>> {
        let n = self.num_speculative.min(k);
        let b = act.len();
        let chosen = match (&self.options.verify, confidence) {
            (VerifyPolicy::Full, _) | (_, None) => vec![n; b],
            (policy, Some(c)) => {
                if c.len() != b * k {
                    return Err(Error::bad_shape(
                        "drafter.propose",
                        "confidences are not [B, K]",
                    ));
                }
                let raw: Vec<f32> = c.chunks(k).flat_map(|row| &row[..n]).copied().collect();
                // The schedulers read survival: each confidence rescaled by how its position's
                // predictions have fared in this call (the threshold keeps the raw values).
                let firsts = match policy {
                    VerifyPolicy::Threshold(_) => raw,
                    _ => recalibrated(&raw, n, run),
                };
                // What a drafted round of this batch spends outside the target forward
                // (proposing, kernels, the context extension), from the rounds observed so far:
                // a round pays it whatever it verifies, so the scheduler weighs each table
                // entry with it (the table is the target's forward alone).
                let outside = self
                    .round_costs(b)?
                    .map(|c| b as f64 * (c.propose + c.drafted_rest));
                let priced = |sps: &StepsPerSecond| match outside {
                    Some(secs) => sps.with_overhead(secs),
                    None => sps.clone(),
                };
                // The scheduler looks past a cliff in the table on the acceptance expected
                // from earlier rounds (never from this round's draws: lossless).
                let ahead = expected_acceptance(run, act, n);
                let lens = match policy {
                    VerifyPolicy::Threshold(t) => threshold_lengths(&firsts, b, n, *t)?,
                    VerifyPolicy::Scheduled(sps) => {
                        schedule_lengths_ahead(&firsts, b, n, &priced(sps), &ahead)?
                    }
                    VerifyPolicy::ScheduledMeasured => {
                        let sps = match measured {
                            Some(t) => t.clone(),
                            None => self.measured_table(b * (n + 1), n + 1)?,
                        };
                        schedule_lengths_ahead(&firsts, b, n, &priced(&sps), &ahead)?
                    }
                    VerifyPolicy::Pipelined(sps) => {
                        // A request's previous-round confidences (its own current ones in
                        // its first round) size the batch; current survival fills it.
                        let stale: Vec<f32> = act
                            .iter()
                            .enumerate()
                            .flat_map(|(j, &i)| match &run.stale[i] {
                                Some(s) if s.len() == n => s.clone(),
                                _ => firsts[j * n..(j + 1) * n].to_vec(),
                            })
                            .collect();
                        schedule_pipelined(&stale, &firsts, b, n, &priced(sps))?
                    }
                    VerifyPolicy::Full => vec![n; b],
                };
                for (j, &i) in act.iter().enumerate() {
                    run.stale[i] = Some(firsts[j * n..(j + 1) * n].to_vec());
                }
                lens
            }
        };
        Ok(chosen
            .into_iter()
            .zip(act)
            .map(|(len, &i)| len.min(run.budget_left(i).saturating_sub(1)))
            .collect())
    }
}
