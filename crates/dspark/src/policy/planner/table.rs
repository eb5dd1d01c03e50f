//! The steps-per-second table of [`VerifyPolicy::ScheduledMeasured`]: the prior from the
//! target's shape and this machine, or a profile when one is asked for, refined by the rounds'
//! forward timings.

use super::Planner;
use crate::error::Result;
use crate::models::{ForwardCost, TargetModel};
use crate::nn::WeightDtype;
use crate::policy::machine::Machine;
use crate::policy::prior::{Split, prior_table};
use crate::policy::profile::{MAX_PROFILE_TOKENS, measure_steps_per_second};
use crate::policy::{StepsPerSecond, VerifyPolicy};

/// The table [`VerifyPolicy::ScheduledMeasured`] refines: the prior from the target's shape
/// and the machine ([`prior_table`]), built up to the verified tokens the rounds need, or the
/// one [`Planner::warm_up`] timed on the target (read past its end as tokens/s held
/// constant).
#[derive(Debug)]
pub(super) struct Base {
    /// Tokens the table reaches.
    pub(super) max: usize,
    pub(super) table: StepsPerSecond,
    /// Timed on the target rather than priced from its shape.
    pub(super) profiled: bool,
    /// The prior's two bounds (`None` for a profile).
    pub(super) split: Option<Split>,
}

/// The prior table of `target` up to `tokens` verified tokens in rows of `row_tokens` (see
/// `prior.rs`), and its split: its stated [`ForwardCost`], else the estimate from its shape
/// (f32 weights on a CPU, 2-byte ones on a device).
fn prior_of<T: TargetModel>(
    target: &T,
    tokens: usize,
    row_tokens: usize,
) -> Result<(StepsPerSecond, Split)> {
    let accelerator = !target.device().is_cpu();
    let cost = match target.forward_cost()? {
        Some(c) => c,
        None => ForwardCost::estimate(
            target.num_hidden_layers(),
            target.hidden_size(),
            target.vocab_size(),
            if accelerator {
                WeightDtype::BF16
            } else {
                WeightDtype::F32
            },
        ),
    };
    let machine = machine_for(accelerator);
    Ok((
        prior_table(&cost, &machine, accelerator, tokens, row_tokens)?,
        Split::new(&cost, &machine, accelerator),
    ))
}

/// This machine, or the nominal `accelerator`.
pub(super) fn machine_for(accelerator: bool) -> Machine {
    if accelerator {
        Machine::accelerator()
    } else {
        Machine::current()
    }
}

impl Planner {
    /// This round's table for `drafting` drafting requests, under
    /// [`VerifyPolicy::ScheduledMeasured`] (the prior, or the profile [`Planner::warm_up`]
    /// timed, refined by the forwards timed so far); `None` otherwise.
    pub(crate) fn round_table<T: TargetModel>(
        &mut self,
        target: &T,
        drafting: usize,
    ) -> Result<Option<StepsPerSecond>> {
        let n = self.num_speculative;
        match (&self.verify, drafting) {
            (VerifyPolicy::ScheduledMeasured, 1..) => self
                .measured_table(target, drafting * (n + 1), n + 1)
                .map(Some),
            _ => Ok(None),
        }
    }

    /// The table of [`VerifyPolicy::ScheduledMeasured`] for up to `tokens` verified tokens in
    /// rows of `row_tokens`: the base table (the prior, rebuilt larger when a batch outgrows
    /// it; a profile from [`Planner::warm_up`] as timed) refined by the forwards observed
    /// since (module `learned`). Nothing is timed here: the prior costs microseconds.
    pub(crate) fn measured_table<T: TargetModel>(
        &mut self,
        target: &T,
        tokens: usize,
        row_tokens: usize,
    ) -> Result<StepsPerSecond> {
        // Past MAX_PROFILE_TOKENS the table holds tokens/s constant.
        let tokens = tokens.min(MAX_PROFILE_TOKENS.max(row_tokens));
        let base = match self.base.take() {
            Some(b) if b.profiled || b.max >= tokens => b,
            _ => {
                let (table, split) = prior_of(target, tokens, row_tokens)?;
                Base {
                    max: tokens,
                    table,
                    profiled: false,
                    split: Some(split),
                }
            }
        };
        let table = self.times.refine(
            &base.table,
            (tokens / row_tokens).max(1)..=tokens,
            base.split.as_ref(),
        );
        self.base = Some(base);
        table
    }

    /// Time the target's table for up to `batch` requests, under
    /// [`VerifyPolicy::ScheduledMeasured`] (nothing under other policies): a profile of its
    /// forwards ([`measure_steps_per_second`]) replaces the prior. Only when asked: the prior
    /// and the rounds' own timings need no profile.
    pub(crate) fn warm_up<T: TargetModel>(&mut self, target: &T, batch: usize) -> Result<()> {
        if !matches!(self.verify, VerifyPolicy::ScheduledMeasured) || batch == 0 {
            return Ok(());
        }
        let row = self.num_speculative + 1;
        let tokens = batch.saturating_mul(row).min(MAX_PROFILE_TOKENS.max(row));
        self.base = Some(Base {
            max: tokens,
            table: measure_steps_per_second(target, tokens, row)?,
            profiled: true,
            split: None,
        });
        Ok(())
    }

    /// The table in use, once built: the base table refined by the forwards observed so far.
    pub(crate) fn measured_steps_per_second(&self) -> Option<StepsPerSecond> {
        let base = self.base.as_ref()?;
        self.times
            .refine(&base.table, 1..=base.max, base.split.as_ref())
            .ok()
    }
}
