//! [`target_only`]: autoregressive decoding without a drafter, the baseline every speculative
//! figure is measured against.

use std::time::Instant;

use super::options::{Request, SpeculatorOptions};
use super::run::check_sampling;
use super::state::Run;
use super::target::TargetModel;
use super::{Generation, OnRound};
use crate::error::Result;

/// Autoregressive decoding of `target` alone, on the same seeds and stop rules as
/// [`Speculator::generate`](super::Speculator::generate) (the baseline: greedy output is
/// identical).
pub fn target_only<T: TargetModel>(
    target: &T,
    options: &SpeculatorOptions,
    requests: &[Request],
    mut on_round: Option<OnRound<'_>>,
) -> Result<Generation> {
    check_sampling(options)?;
    let t0 = Instant::now();
    let mut run = Run::new(target, options, requests, &[])?;
    let mut hook = 0.0;
    if run.any_active() {
        run.prefill()?;
        run.stats.prefill_seconds = t0.elapsed().as_secs_f64();
        hook += run.report(&mut on_round)?;
        while run.any_active() {
            let act = run.active();
            let t = Instant::now();
            let (_, _, forward) = crate::threads::in_round(|| run.step(&act))?;
            for &i in &act {
                run.lengths[i] += 1;
            }
            run.stats.rounds += 1;
            run.stats.target_seconds += forward;
            run.stats.kernel_seconds += t.elapsed().as_secs_f64() - forward;
            hook += run.report(&mut on_round)?;
        }
    }
    run.stats.total_seconds = t0.elapsed().as_secs_f64() - hook;
    Ok(Generation {
        tokens: run.out,
        stats: run.stats,
    })
}
