//! [`target_only`]: autoregressive decoding without a drafter, the baseline every speculative
//! figure is measured against.

use std::time::Instant;

use super::options::{Request, SpeculatorOptions, Use};
use super::run::check_sampling;
use super::state::{Run, select_rows, verify_where};
use super::target::{LogitRows, TargetModel};
use super::{Generation, OnRound};
use crate::error::Result;

/// Autoregressive decoding of `target` alone, on the same seeds and stop rules as
/// [`Speculator::generate`] (the baseline: greedy output is identical).
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
            let b = requests.len();
            let mut ids = vec![0u32; b];
            let mut num = vec![0usize; b];
            for &i in &act {
                ids[i] = run.anchors[i];
                num[i] = 1;
            }
            let t = Instant::now();
            let out = crate::threads::in_round(|| run.forward(&ids, 1, &num, LogitRows::All))?;
            let t1 = Instant::now();
            let logits = select_rows(&out.logits, &act, b)?;
            let seeds = act.iter().map(|&i| run.seed(i, Use::Verify)).collect();
            let options = run.verify_options(seeds, None);
            let v = crate::threads::in_round(|| {
                verify_where(&logits, run.vocab, Vec::new(), 0, None, &options)
            })?;
            for &i in &act {
                run.lengths[i] += 1;
            }
            run.commit_round(&act, &vec![0; act.len()], &v);
            run.stats.rounds += 1;
            run.stats.target_seconds += (t1 - t).as_secs_f64();
            run.stats.kernel_seconds += t1.elapsed().as_secs_f64();
            hook += run.report(&mut on_round)?;
        }
    }
    run.stats.total_seconds = t0.elapsed().as_secs_f64() - hook;
    Ok(Generation {
        tokens: run.out,
        stats: run.stats,
    })
}
