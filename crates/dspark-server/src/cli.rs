//! `dspark serve` options: one clap definition, so `dspark serve --help` (the Python CLI) and
//! `cargo run --release -p dspark-server -- --help` print the same text.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

/// How many drafts each round verifies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verify {
    /// The whole block.
    Full,
    /// The paper's scheduler over a steps-per-second table measured at first use.
    Scheduled,
    /// The prefix whose confidence is at least this, in `[0, 1]`.
    Threshold(f32),
}

fn parse_verify(s: &str) -> Result<Verify, String> {
    match s {
        "full" => Ok(Verify::Full),
        "scheduled" => Ok(Verify::Scheduled),
        _ => match s.parse::<f32>() {
            Ok(t) if (0.0..=1.0).contains(&t) => Ok(Verify::Threshold(t)),
            _ => Err(format!(
                "`{s}`: expected full, scheduled, or a threshold in [0, 1]"
            )),
        },
    }
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("`{s}`: expected an integer >= 1")),
    }
}

/// Weight dtype of the native target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Dtype {
    /// 32-bit floats.
    #[value(alias = "f32")]
    Float32,
    /// bfloat16.
    #[value(alias = "bf16")]
    Bfloat16,
    /// IEEE half.
    #[value(alias = "f16")]
    Float16,
    /// Q8_0: the layers' linear maps and the output head in 8-bit blocks (32 weights, one f16
    /// scale), the embedding as stored.
    #[value(name = "q8_0", alias = "q8")]
    Q8_0,
    /// Q4_K: the layers' linear maps in 4-bit super-blocks (256 weights, 6-bit scales and mins,
    /// two f16 factors), the output head in Q8_0, the embedding as stored.
    #[value(name = "q4_k", alias = "q4k")]
    Q4K,
}

impl Dtype {
    /// The name the engine's load options take (`float32`, `bfloat16`, `float16`, `q8_0`,
    /// `q4_k`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Float32 => "float32",
            Self::Bfloat16 => "bfloat16",
            Self::Float16 => "float16",
            Self::Q8_0 => "q8_0",
            Self::Q4K => "q4_k",
        }
    }
}

/// Element type of the native target's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KvDtype {
    /// 32-bit floats.
    #[value(alias = "f32")]
    Float32,
    /// IEEE half: half the bytes a decode step reads at a long context.
    #[value(alias = "f16")]
    Float16,
    /// bfloat16 (queries and probabilities are rounded to bf16 too).
    #[value(alias = "bf16")]
    Bfloat16,
}

impl KvDtype {
    /// The name the engine's load options take (`float32`, `float16`, `bfloat16`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Float32 => "float32",
            Self::Float16 => "float16",
            Self::Bfloat16 => "bfloat16",
        }
    }
}

/// dspark serve: an OpenAI-compatible HTTP server on the dspark engine.
///
/// Serves POST /v1/completions and /v1/chat/completions (streaming with server-sent events),
/// GET /v1/models, /health and /metrics (Prometheus) for a native Qwen3 target and its DSpark
/// drafter, with speculative decoding in continuous batching. Without --target and
/// --drafter it serves the bundled tiny pair. `cargo run --release -p dspark-server -- ...`
/// runs the same server with the same options. SIGTERM or Ctrl-C stops admitting, lets the
/// requests in flight finish for up to --shutdown-timeout seconds, aborts the rest and exits 0.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "dspark serve",
    bin_name = "dspark serve",
    version,
    max_term_width = 100
)]
pub struct ServeArgs {
    /// Target: a Hugging Face Qwen3ForCausalLM directory with tokenizer.json, or a Qwen3 GGUF
    /// file (its tokenizer, config and chat template from the file) [default: the bundled
    /// pair's target]
    #[arg(long, value_name = "DIR|FILE")]
    pub target: Option<PathBuf>,

    /// DSpark drafter checkpoint directory for the target [default: the bundled pair's
    /// drafter]
    #[arg(long, value_name = "DIR")]
    pub drafter: Option<PathBuf>,

    /// Address to listen on
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,

    /// Port to listen on (0: any free port; the line "listening on http://HOST:PORT" on
    /// stderr says which)
    #[arg(long, default_value_t = 8000)]
    pub port: u16,

    /// The model name clients send and /v1/models lists [default: the target directory's
    /// name]
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,

    /// Drafts each round verifies: scheduled (the paper's scheduler on a cost model that
    /// needs no profile, with plain target steps where drafting would not pay), full (the
    /// whole block), or a confidence threshold in [0, 1]
    #[arg(long, default_value = "scheduled", value_parser = parse_verify, value_name = "full|scheduled|THRESHOLD")]
    pub verify: Verify,

    /// Drafts verified per round at most (0: no drafting, plain decoding) [default: the
    /// drafter's block]
    #[arg(long, value_name = "N")]
    pub num_speculative_tokens: Option<usize>,

    /// Requests in the running batch at most
    #[arg(long, default_value_t = 256, value_parser = positive, value_name = "N")]
    pub max_running: usize,

    /// Requests queued beyond --max-running at most; more are answered 429 with Retry-After
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub max_queue: usize,

    /// New tokens one step's target forward takes at most
    #[arg(long, default_value_t = 8192, value_parser = positive, value_name = "N")]
    pub max_batched_tokens: usize,

    /// KV cache tokens the running requests may hold together; a running request that cannot
    /// grow preempts the newest one [default: unbounded]
    #[arg(long, value_parser = positive, value_name = "N")]
    pub kv_tokens: Option<usize>,

    /// Prompt plus completion tokens per request at most [default: the target's
    /// max_position_embeddings]
    #[arg(long, value_parser = positive, value_name = "N")]
    pub max_model_len: Option<usize>,

    /// Threads of the engine's CPU pool [default: one per core]
    #[arg(long, value_parser = positive, value_name = "N")]
    pub threads: Option<usize>,

    /// Weight dtype of the target: float32, bfloat16, float16, q8_0 (8-bit layers) or q4_k (4-bit
    /// layers)
    #[arg(long, value_enum, default_value = "float32")]
    pub dtype: Dtype,

    /// Element type of the target's KV cache: float32, float16 or bfloat16 [default: the
    /// engine's, float16]
    #[arg(long, value_enum)]
    pub kv_dtype: Option<KvDtype>,

    /// Device: cpu, cuda or cuda:N (CUDA needs the CUDA build)
    #[arg(long, default_value = "cpu")]
    pub device: String,

    /// Request bodies larger than this get 413
    #[arg(long, default_value_t = 8 << 20, value_parser = positive, value_name = "BYTES")]
    pub max_body_bytes: usize,

    /// Seconds in-flight requests may take to finish after SIGTERM before they are aborted
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub shutdown_timeout: f64,

    /// Test mode: serve with a deterministic echo engine instead of the model (the HTTP layer
    /// alone; the target directory still gives the tokenizer and limits).
    #[cfg(feature = "test-engine")]
    #[arg(long, hide = true)]
    pub fake_engine: bool,

    /// Test mode: milliseconds each step of the echo engine sleeps.
    #[cfg(feature = "test-engine")]
    #[arg(long, hide = true, default_value_t = 2)]
    pub fake_step_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn parses_and_checks() {
        ServeArgs::command().debug_assert();
        let a = ServeArgs::try_parse_from(["x", "--verify", "0.4", "--port", "0"]).unwrap();
        assert_eq!(a.verify, Verify::Threshold(0.4));
        assert_eq!(a.port, 0);
        assert_eq!(a.dtype, Dtype::Float32);
        for bad in [
            &["x", "--verify", "1.5"][..],
            &["x", "--max-running", "0"],
            &["x", "--dtype", "int8"],
            &["x", "--kv-dtype", "q8_0"],
            &["x", "--port", "70000"],
            &["x", "--nope"],
        ] {
            assert!(ServeArgs::try_parse_from(bad).is_err(), "{bad:?}");
        }
        let a = ServeArgs::try_parse_from(["x", "--dtype", "bf16"]).unwrap();
        assert_eq!(a.dtype, Dtype::Bfloat16);
        let a = ServeArgs::try_parse_from(["x", "--dtype", "q8_0"]).unwrap();
        assert_eq!((a.dtype, a.dtype.name()), (Dtype::Q8_0, "q8_0"));
        assert_eq!(a.kv_dtype, None);
        let a = ServeArgs::try_parse_from(["x", "--dtype", "q4_k"]).unwrap();
        assert_eq!((a.dtype, a.dtype.name()), (Dtype::Q4K, "q4_k"));
        assert!(ServeArgs::try_parse_from(["x", "--dtype", "q3_k"]).is_err());
        let a = ServeArgs::try_parse_from(["x", "--kv-dtype", "f16"]).unwrap();
        assert_eq!(a.kv_dtype.map(KvDtype::name), Some("float16"));
        let a = ServeArgs::try_parse_from(["x", "--kv-dtype", "bfloat16"]).unwrap();
        assert_eq!(a.kv_dtype, Some(KvDtype::Bfloat16));
    }

    #[test]
    fn help_names_the_command() {
        let help = ServeArgs::command().render_long_help().to_string();
        assert!(help.contains("Usage: dspark serve [OPTIONS]"), "{help}");
        assert!(help.contains("--kv-tokens"));
        assert!(!help.contains("fake-engine"));
    }
}
