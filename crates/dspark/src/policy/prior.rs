//! The cost model's prior: a steps-per-second table from what is known before the first round,
//! the target's shape ([`ForwardCost`]) and this machine's speed ([`Machine`]), with nothing
//! profiled.
//!
//! A forward of `n` tokens reads the target's weights once and multiplies them by every token:
//!
//! `t(n) = layers · LAYER_OVERHEAD + max(weight_bytes / read_rate, n · flops_per_token / flop_rate)`
//!
//! The first term is what a forward spends issuing its operations (a few microseconds per
//! layer on a CPU, tens of them on a GPU whose every launch costs host time). The engine's
//! round loop refines the table from each forward it times (module `learned`): the median
//! ratio of the timings to each bound ([`Split`]: the reads and the multiplies) rescales that
//! bound from the first round on, and a token count timed three times or more is priced by its
//! own timings. The drafter's block pass is priced the same way, by its own shape
//! ([`Drafter::propose_cost`](crate::drafter::Drafter::propose_cost)) and the target's scales.

use crate::error::Result;
use crate::models::ForwardCost;
use crate::policy::StepsPerSecond;

use super::machine::Machine;
use super::profile::profile_sizes;

/// Seconds one decoder layer spends outside its reads and multiplies on a CPU.
const CPU_LAYER_OVERHEAD: f64 = 4e-6;

/// The same on an accelerator (candle issues each operation from the host).
const DEVICE_LAYER_OVERHEAD: f64 = 2e-4;

/// Seconds of a forward of `tokens` tokens of `cost` on `machine` (see the module docs);
/// `accelerator`: the target runs on a device.
pub(crate) fn seconds(
    cost: &ForwardCost,
    tokens: usize,
    machine: &Machine,
    accelerator: bool,
) -> f64 {
    let (read, compute) = Split::new(cost, machine, accelerator).parts(tokens);
    read.max(compute)
}

/// A forward's prior split in its two bounds: the overhead with the weights' reads, and the
/// overhead with the multiplies of its tokens. The refinement (module `learned`) scales each by
/// the timings of forwards it bounds: a decode step times the first, a prefill the second.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Split {
    overhead: f64,
    read: f64,
    per_token: f64,
}

impl Split {
    /// The split of `cost` on `machine` (`accelerator`: on a device).
    pub(crate) fn new(cost: &ForwardCost, machine: &Machine, accelerator: bool) -> Self {
        let layer = cost.layer_seconds.unwrap_or(if accelerator {
            DEVICE_LAYER_OVERHEAD
        } else {
            CPU_LAYER_OVERHEAD
        });
        Self {
            overhead: cost.layers.max(1) as f64 * layer,
            read: cost.weight_bytes / machine.read_rate(cost.weight_bytes),
            per_token: cost.flops_per_token / machine.flops(cost.dtype, cost.quant),
        }
    }

    /// `(overhead + reads, overhead + multiplies)` of a forward of `tokens` tokens, in seconds.
    pub(crate) fn parts(&self, tokens: usize) -> (f64, f64) {
        (
            self.overhead + self.read,
            self.overhead + tokens as f64 * self.per_token,
        )
    }
}

/// The prior table of `cost` up to `max_tokens` verified tokens, over the sizes the profile
/// would time for rows of `row_tokens` (dense over two rows, then growing by half).
///
/// Errors: `invalid-argument` for counts that are not finite and positive.
pub(crate) fn prior_table(
    cost: &ForwardCost,
    machine: &Machine,
    accelerator: bool,
    max_tokens: usize,
    row_tokens: usize,
) -> Result<StepsPerSecond> {
    cost.validate()?;
    let points = profile_sizes(max_tokens.max(2), row_tokens.max(1))
        .into_iter()
        .map(|n| (n, 1.0 / seconds(cost, n, machine, accelerator)))
        .collect();
    StepsPerSecond::linear(points)
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::WeightDtype;

    const M: Machine = Machine {
        read_bytes_per_s: 2e10,
        cache_bytes: 0.0,
        cache_read_bytes_per_s: 2e10,
        flops_f32: 1e11,
        flops_bf16: 5e10,
        flops_q8_0: 2e11,
        flops_q4_k: 2.5e11,
    };

    #[test]
    fn weights_that_fit_in_half_the_cache_are_read_at_its_rate() {
        let cached = Machine {
            cache_bytes: 6.4e7,
            cache_read_bytes_per_s: 1e11,
            ..M
        };
        let cost = |bytes: f64| ForwardCost {
            weight_bytes: bytes,
            flops_per_token: 1.0,
            layers: 1,
            dtype: WeightDtype::F32,
            quant: None,
            layer_seconds: Some(0.0),
        };
        let read = |bytes: f64, m: &Machine| Split::new(&cost(bytes), m, false).parts(1).0;
        // 16 MB, within half of a 64 MB cache: 0.16 ms at its rate (0.8 ms from memory).
        assert!((read(1.6e7, &cached) - 1.6e-4).abs() < 1e-12);
        // 48 MB, past half of it: from memory.
        assert!((read(4.8e7, &cached) - 2.4e-3).abs() < 1e-12);
        // A cache of unknown size: from memory.
        assert!((read(1.6e7, &M) - 8e-4).abs() < 1e-12);
    }

    #[test]
    fn a_small_forward_reads_and_a_large_one_multiplies() {
        // 1 GB of f32 weights: 50 ms to read; 0.5 GFLOP a token: 5 ms each at 100 GFLOP/s.
        let c = ForwardCost {
            weight_bytes: 1e9,
            flops_per_token: 5e8,
            layers: 10,
            dtype: WeightDtype::F32,
            quant: None,
            layer_seconds: None,
        };
        let t = |c: &ForwardCost, n| seconds(c, n, &M, false) - 10.0 * CPU_LAYER_OVERHEAD;
        assert!((t(&c, 1) - 0.05).abs() < 1e-12 && (t(&c, 10) - 0.05).abs() < 1e-12);
        assert!((t(&c, 20) - 0.1).abs() < 1e-12, "{}", t(&c, 20));
        // bf16 halves the bytes, and here the multiply rate: the knee comes at a quarter of
        // the tokens.
        let b = ForwardCost {
            dtype: WeightDtype::BF16,
            weight_bytes: 5e8,
            ..c
        };
        assert!((t(&b, 2) - 0.025).abs() < 1e-12 && (t(&b, 10) - 0.1).abs() < 1e-12);
        // A quantized target multiplies at its format's rate, not its panels' dtype's (f32):
        // Q4_K here at 2.5x the f32 rate, a quarter of the bytes: 12.5 ms to read, 2 ms a
        // token (5 ms at the f32 rate).
        let q = ForwardCost {
            quant: Some(crate::nn::quant::Quant::Q4K),
            weight_bytes: 2.5e8,
            ..c
        };
        assert!((t(&q, 1) - 0.0125).abs() < 1e-12, "{}", t(&q, 1));
        assert!((t(&q, 8) - 0.016).abs() < 1e-12, "{}", t(&q, 8));
        // A device forward pays more per layer, and a target may say what it pays.
        assert!(seconds(&c, 1, &M, true) > seconds(&c, 1, &M, false));
        let py = ForwardCost {
            layer_seconds: Some(1e-4),
            ..c
        };
        assert!((seconds(&py, 1, &M, false) - 1e-3 - 0.05).abs() < 1e-12);
        let table = prior_table(&c, &M, false, 64, 5).unwrap();
        assert!(table.sps(1) > 0.0 && table.sps(1) >= table.sps(64));
        assert_eq!(table.points().last().map(|p| p.0), Some(64));
        let sizes: Vec<usize> = table.points().iter().map(|p| p.0).collect();
        assert_eq!(sizes, profile_sizes(64, 5));
    }

    #[test]
    fn bad_counts_are_typed() {
        let mut c = ForwardCost::estimate(2, 64, 1000, WeightDtype::F32);
        c.flops_per_token = 0.0;
        assert_eq!(
            prior_table(&c, &M, false, 8, 2).unwrap_err().code(),
            "invalid-argument"
        );
    }
}
