//! Speculative generation with dspark: a native Qwen3 target, a DSpark drafter sharing its
//! embedding and lm_head, the engine's [`Speculator`], text in and out through `tokenizers`.
//!
//! ```text
//! cargo run --release --example generate -- --target DIR --drafter DIR \
//!     (--prompt TEXT | --prompt-ids 1,2,3) [--max-new-tokens N] [--temperature T] [--seed S] \
//!     [--verify full|threshold|scheduled] [--threshold C] [--target-only] [--json]
//! ```
//!
//! Text streams to stdout as rounds commit (to stderr with `--json`, whose object is then all
//! of stdout); a summary goes to stderr. Generation stops at the `eos_token_id`(s) of the
//! target's `generation_config.json` (else `config.json`). Errors are one line
//! `generate: error [CODE]: MESSAGE`, exit code 1 (2 for usage errors).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::Device;
use dspark::policy::StepsPerSecond;
use dspark::speculator::{LogitRows, Request, RoundUpdate, SpeculatorOptions, TargetInput};
use dspark::speculator::{VerifyPolicy, target_only};
use dspark::{Drafter, Error, Qwen3Drafter, Qwen3Target, Speculator, TargetModel};
use serde_json::{Value, json};
use tokenizers::Tokenizer;

const USAGE: &str = "usage: generate --target DIR --drafter DIR (--prompt TEXT | --prompt-ids \
    1,2,3) [--max-new-tokens N] [--temperature T] [--seed S] \
    [--verify full|threshold|scheduled] [--threshold C] [--target-only] [--json]";

/// `(code, message)` of the one error line; code `usage` exits with 2.
type Fail = (String, String);

fn fail(code: &str, message: impl ToString) -> Fail {
    (code.to_string(), message.to_string())
}

fn engine(e: Error) -> Fail {
    fail(e.code(), e)
}

fn tokenizer(e: tokenizers::Error) -> Fail {
    fail("tokenizer", e)
}

#[derive(Default)]
struct Args {
    target: Option<PathBuf>,
    drafter: Option<PathBuf>,
    prompt: Option<String>,
    prompt_ids: Option<Vec<u32>>,
    max_new_tokens: Option<usize>,
    verify: Option<String>,
    threshold: Option<f32>,
    target_only: bool,
    json: bool,
    options: SpeculatorOptions,
}

fn usage(message: String) -> Fail {
    fail("usage", format!("{message} (--help for usage)"))
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, Fail> {
    let bad = |_| usage(format!("{flag}: `{v}` is not a valid value"));
    v.trim().parse().map_err(bad)
}

fn parse_args() -> Result<Args, Fail> {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| usage(format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--target-only" => a.target_only = true,
            "--json" => a.json = true,
            "--target" => a.target = Some(value()?.into()),
            "--drafter" => a.drafter = Some(value()?.into()),
            "--prompt" => a.prompt = Some(value()?),
            "--prompt-ids" => {
                let ids = value()?;
                let ids = ids.split(',').map(|t| num(&flag, t));
                a.prompt_ids = Some(ids.collect::<Result<_, _>>()?);
            }
            "--max-new-tokens" => a.max_new_tokens = Some(num(&flag, &value()?)?),
            "--temperature" => a.options.temperature = num(&flag, &value()?)?,
            "--seed" => a.options.seed = Some(num(&flag, &value()?)?),
            "--threshold" => a.threshold = Some(num(&flag, &value()?)?),
            "--verify" => a.verify = Some(value()?),
            _ => return Err(usage(format!("unknown argument `{flag}`"))),
        }
    }
    if a.target.is_none() || (a.drafter.is_none() && !a.target_only) {
        return Err(usage("--target and --drafter are required".into()));
    }
    if a.prompt.is_some() == a.prompt_ids.is_some() {
        return Err(usage("give one of --prompt and --prompt-ids".into()));
    }
    a.options.verify = match a.verify.as_deref().unwrap_or("full") {
        "full" | "scheduled" => VerifyPolicy::Full, // scheduled: measured once loaded
        "threshold" => VerifyPolicy::Threshold(a.threshold.unwrap_or(0.5)),
        v => {
            return Err(usage(format!(
                "--verify {v}: not full, threshold or scheduled"
            )));
        }
    };
    Ok(a)
}

/// The `eos_token_id`(s) (an int or a list) of `generation_config.json`, else `config.json`.
fn eos_ids(dir: &Path) -> Vec<u32> {
    let read = |f: &str| -> Option<Value> {
        let v: Value = serde_json::from_slice(&std::fs::read(dir.join(f)).ok()?).ok()?;
        v.get("eos_token_id").filter(|e| !e.is_null()).cloned()
    };
    let ids = match read("generation_config.json").or_else(|| read("config.json")) {
        Some(Value::Array(v)) => v,
        Some(v) => vec![v],
        None => Vec::new(),
    };
    ids.iter()
        .filter_map(Value::as_u64)
        .map(|x| x as u32)
        .collect()
}

/// The scheduler's steps/s table: one-request verify forwards of 1..=`max_tokens` tokens after
/// `prompt`, three timed passes each on a throwaway cache rolled back after every pass.
fn steps_per_second<T: TargetModel>(
    target: &T,
    prompt: &[u32],
    max_tokens: usize,
) -> dspark::Result<StepsPerSecond> {
    let mut cache = target.new_cache(1)?;
    let forward = |cache: &mut T::Cache, tokens: &[u32], logits| {
        let num_tokens = [tokens.len()];
        let width = tokens.len();
        let input = TargetInput {
            tokens,
            width,
            num_tokens: &num_tokens,
            logits,
        };
        target.forward(cache, &input, &[]).map(drop)
    };
    forward(&mut cache, prompt, LogitRows::Last)?;
    let mut points = Vec::new();
    for n in 1..=max_tokens {
        let block = vec![prompt[prompt.len() - 1]; n];
        let t = Instant::now();
        for _ in 0..3 {
            forward(&mut cache, &block, LogitRows::All)?;
            target.truncate(&mut cache, &[prompt.len()])?;
        }
        points.push((n, 3.0 / t.elapsed().as_secs_f64()));
    }
    StepsPerSecond::linear(points)
}

fn run(a: Args) -> Result<(), Fail> {
    let dir = a.target.unwrap_or_default();
    let tok = Tokenizer::from_file(dir.join("tokenizer.json")).map_err(tokenizer)?;
    let prompt = match (a.prompt, a.prompt_ids) {
        (Some(text), _) => tok
            .encode(text, true)
            .map_err(tokenizer)?
            .get_ids()
            .to_vec(),
        (None, ids) => ids.unwrap_or_default(),
    };
    let target = Qwen3Target::load(&dir, &Device::Cpu).map_err(engine)?;
    let request = Request {
        prompt: prompt.clone(),
        max_new_tokens: a.max_new_tokens.unwrap_or(128),
        stop_token_ids: eos_ids(&dir),
        seed: None,
    };
    // Streaming: decode the whole output so far and print what is new (held back while it
    // ends inside a multi-byte character).
    let (mut all, mut shown) = (Vec::new(), String::new());
    let mut out: Box<dyn Write> = if a.json {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    let mut on_round = |u: &RoundUpdate<'_>| -> dspark::Result<()> {
        all.extend_from_slice(u.new_tokens[0]);
        let text = tok
            .decode(&all, true)
            .map_err(|e| Error::callback("tokenizer.decode", e.to_string()))?;
        if let Some(new) = text
            .strip_prefix(shown.as_str())
            .filter(|s| !s.ends_with('\u{FFFD}'))
        {
            let _ = write!(out, "{new}").and_then(|()| out.flush());
            shown = text;
        }
        Ok(())
    };
    let (generation, k) = match &a.drafter {
        Some(dir) if !a.target_only => {
            let drafter = Qwen3Drafter::load(dir, &target.target_spec(), target.shared_weights())
                .map_err(engine)?;
            let k = drafter.info().num_draft_tokens;
            let mut options = a.options;
            if a.verify.as_deref() == Some("scheduled") {
                let table = steps_per_second(&target, &prompt, k + 1).map_err(engine)?;
                options.verify = VerifyPolicy::Scheduled(table);
            }
            let speculator = Speculator::new(target, drafter, options).map_err(engine)?;
            (
                speculator
                    .generate(&[request], Some(&mut on_round))
                    .map_err(engine)?,
                k,
            )
        }
        _ => (
            target_only(&target, &a.options, &[request], Some(&mut on_round)).map_err(engine)?,
            0,
        ),
    };
    let _ = writeln!(out);
    let (tokens, st) = (&generation.tokens[0], &generation.stats);
    let tps = tokens.len() as f64 / st.total_seconds;
    eprintln!(
        "{} new tokens in {:.3} s: {tps:.1} tokens/s; acceptance length {:.2} (max {}), {} \
         rounds; seconds in target {:.3}, drafter {:.3}, kernels {:.3}",
        tokens.len(),
        st.total_seconds,
        st.acceptance_length(),
        k + 1,
        st.rounds,
        st.target_seconds,
        st.drafter_seconds,
        st.kernel_seconds,
    );
    if a.json {
        let text = tok.decode(tokens, true).map_err(tokenizer)?;
        let summary = json!({
            "tokens": tokens,
            "text": text,
            "acceptance_length": st.acceptance_length(),
            "tokens_per_second": tps,
            "rounds": st.rounds,
        });
        println!("{summary}");
    }
    Ok(())
}

fn main() {
    if let Err((code, message)) = parse_args().and_then(run) {
        eprintln!("generate: error [{code}]: {message}");
        std::process::exit(if code == "usage" { 2 } else { 1 });
    }
}
