//! Loading what `dspark serve` runs: the native target and drafter pair (as
//! `crates/dspark/examples/generate.rs` loads it: `Qwen3Target::load`, then
//! `Qwen3Drafter::builder` sharing the target's embedding and lm_head, with `sts.json` when the
//! drafter directory has one), the engine's options from the command line, and the thread pool.

use std::path::{Path, PathBuf};

use dspark::device::parse_device;
use dspark::engine::{Budget, EngineConfig};
use dspark::speculator::VerifyPolicy;
use dspark::{LoadOptions, Qwen3Drafter, Qwen3Target, TargetModel};

use crate::cli::{Dtype, KvDtype, ServeArgs, Verify};
use crate::error::StartError;

/// The bundled pair in this source tree (`python/dspark/models/tiny`), the default of
/// `cargo run -p dspark-server`; the Python CLI passes the installed package's copy.
pub const SOURCE_BUNDLED_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../python/dspark/models/tiny"
);

/// `--target` and `--drafter`, defaulting to the bundled pair (`bundled`, else the source
/// tree's).
pub fn pair_dirs(
    args: &ServeArgs,
    bundled: Option<&Path>,
) -> Result<(PathBuf, PathBuf), StartError> {
    // A drafter is trained for one target: half of the bundled pair never fits a given model.
    let one = |given: &str, missing: &str| {
        StartError::new(
            "usage",
            format!(
                "{given} given without {missing}: a DSpark drafter fits only the target it was \
                 trained for; give both, or neither to serve the bundled pair"
            ),
        )
    };
    match (&args.target, &args.drafter) {
        (Some(_), None) => return Err(one("--target", "--drafter")),
        (None, Some(_)) => return Err(one("--drafter", "--target")),
        _ => {}
    }
    let root = bundled.map_or_else(|| PathBuf::from(SOURCE_BUNDLED_DIR), Path::to_path_buf);
    let pick = |given: &Option<PathBuf>, sub: &str, flag: &str| match given {
        Some(dir) => Ok(dir.clone()),
        None if root.join(sub).is_dir() => Ok(root.join(sub)),
        None => Err(StartError::new(
            "usage",
            format!("{flag} not given and no bundled pair at {}", root.display()),
        )),
    };
    Ok((
        pick(&args.target, "target", "--target")?,
        pick(&args.drafter, "drafter", "--drafter")?,
    ))
}

/// The engine's options from the command line.
pub fn engine_config(args: &ServeArgs) -> EngineConfig {
    let verify = match args.verify {
        Verify::Full => VerifyPolicy::Full,
        Verify::Scheduled => VerifyPolicy::ScheduledMeasured,
        Verify::Threshold(t) => VerifyPolicy::Threshold(t),
    };
    EngineConfig {
        verify,
        // 0 (no drafting) goes on every request as `max_drafts = 0`, the documented way.
        num_speculative_tokens: args.num_speculative_tokens.filter(|&n| n > 0),
        record_confidence: false,
        budget: Budget {
            max_running: args.max_running,
            max_batched_tokens: args.max_batched_tokens,
            kv_tokens: args.kv_tokens,
        },
    }
}

/// Size rayon's global pool (the engine's CPU threads); a pool that already exists (the
/// server started twice in one process) is kept, with a warning.
pub fn set_threads(threads: Option<usize>) {
    if let Some(n) = threads
        && rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .is_err()
    {
        tracing::warn!("--threads {n}: the thread pool already exists, kept as it is");
    }
}

/// Load the native target and its drafter on `device`.
pub fn load_pair(
    target: &Path,
    drafter: &Path,
    device: &str,
    (dtype, kv): (Dtype, Option<KvDtype>),
) -> Result<(Qwen3Target, Qwen3Drafter), StartError> {
    let device = parse_device("--device", device)?;
    let options = LoadOptions::with_dtype_name(Some(dtype.name()))?
        .with_kv_dtype_name(kv.map(KvDtype::name))?;
    let target = Qwen3Target::open(target, &device, options)?;
    let drafter = Qwen3Drafter::builder(&target.target_spec())
        .shared(target.shared_weights())
        .device(&target.device())
        .load(drafter)?;
    Ok((target, drafter))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use dspark::Drafter;

    #[test]
    fn the_bundled_pair_loads() {
        let args = ServeArgs::try_parse_from(["x"]).unwrap();
        let (t, d) = pair_dirs(&args, None).unwrap();
        let (target, drafter) = load_pair(&t, &d, "cpu", (Dtype::Float32, None)).unwrap();
        assert_eq!(target.vocab_size(), 3000);
        assert!(drafter.info().block_size > 1);
        assert_eq!(target.kv_dtype(), dspark::nn::DEFAULT_KV_DTYPE);
        let kv = Some(KvDtype::Bfloat16);
        let (bf16, _) = load_pair(&t, &d, "cpu", (Dtype::Bfloat16, kv)).unwrap();
        assert_eq!(bf16.weight_dtype(), dspark::WeightDtype::BF16);
        assert_eq!(bf16.kv_dtype(), dspark::WeightDtype::BF16);
        let (q8, _) = load_pair(&t, &d, "cpu", (Dtype::Q8_0, None)).unwrap();
        assert_eq!(q8.quant(), Some(dspark::nn::quant::Quant::Q8_0));
        let (q4, _) = load_pair(&t, &d, "cpu", (Dtype::Q4K, None)).unwrap();
        assert_eq!(q4.quant(), Some(dspark::nn::quant::Quant::Q4K));
        let e = load_pair(&t, &d, "tpu", (Dtype::Float32, None)).unwrap_err();
        assert_eq!(e.code, "invalid-argument");
    }

    #[test]
    fn half_a_pair_is_a_usage_error() {
        for (flag, missing) in [("--target", "--drafter"), ("--drafter", "--target")] {
            let args = ServeArgs::try_parse_from(["x", flag, "/some/dir"]).unwrap();
            let e = pair_dirs(&args, None).unwrap_err();
            assert_eq!(e.code, "usage");
            assert!(
                e.message
                    .contains(&format!("{flag} given without {missing}")),
                "{e}"
            );
        }
    }

    #[test]
    fn options_map_to_the_engine_config() {
        let args = ServeArgs::try_parse_from([
            "x",
            "--verify",
            "scheduled",
            "--num-speculative-tokens",
            "0",
            "--kv-tokens",
            "4096",
            "--max-running",
            "8",
        ])
        .unwrap();
        let c = engine_config(&args);
        assert_eq!(c.verify, VerifyPolicy::ScheduledMeasured);
        assert_eq!(c.num_speculative_tokens, None);
        assert_eq!(c.budget.kv_tokens, Some(4096));
        assert_eq!(c.budget.max_running, 8);
    }
}
