//! # dspark-server
//!
//! `dspark serve`: an OpenAI-compatible HTTP server (tokio + axum) on the dspark engine. The
//! engine runs on its own OS thread behind channels ([`engine_thread`]); the HTTP side
//! validates requests ([`api`]), renders chat templates ([`chat`]), turns token streams into
//! text with stop strings ([`detok`], [`session`]), streams server-sent events ([`stream`]),
//! exports Prometheus metrics ([`metrics`]) and shuts down gracefully ([`shutdown`]).
//!
//! [`run_cli`] is the whole program: the `dspark-server` binary and the Python CLI's
//! `dspark serve` (through the extension, with the GIL released) both call it.

pub mod api;
pub mod chat;
pub mod cli;
pub mod detok;
pub mod engine;
pub mod engine_adapter;
pub mod engine_thread;
pub mod error;
#[cfg(feature = "test-engine")]
pub mod fake;
pub mod grammar;
pub mod load;
pub mod logprobs;
pub mod metrics;
pub mod model;
pub mod routes;
pub mod server;
pub mod session;
pub mod shutdown;
pub mod state;
pub mod stream;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use crate::cli::ServeArgs;
use crate::engine::ServingEngine;
use crate::engine_thread::EngineHandle;
use crate::error::StartError;
#[cfg(feature = "test-engine")]
use crate::fake::{FakeConfig, FakeEngine};
use crate::metrics::ServerMetrics;
use crate::model::ModelInfo;
use crate::state::AppState;

/// Run `dspark serve` with `argv` (the first item is the program name); `bundled`: the
/// bundled pair's directory (the Python package's copy), defaulting to the source tree's.
/// Returns the exit code: 0 (served and shut down, or `--help`), 1 (could not start), 2
/// (usage). Errors are one line on stderr, `dspark serve: error [CODE]: MESSAGE`.
pub fn run_cli<I, T>(argv: I, bundled: Option<&Path>) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args = match ServeArgs::try_parse_from(argv) {
        Ok(args) => args,
        Err(e) => return cli_error(&e),
    };
    init_logging();
    match run(&args, bundled) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("dspark serve: error {e}");
            if e.code == "usage" { 2 } else { 1 }
        }
    }
}

/// A command-line parse error: `--help` / `--version` printed as clap writes them (exit 0),
/// anything else as the one documented line, `dspark serve: error [usage]: MESSAGE (see:
/// dspark serve --help)`, exit 2.
fn cli_error(e: &clap::Error) -> i32 {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return 0;
    }
    eprintln!("dspark serve: error {}", usage_error(e));
    2
}

/// The [`StartError`] of a parse error: clap's first line without its `error: ` prefix and
/// with its quotes unstyled.
fn usage_error(e: &clap::Error) -> StartError {
    let text = e.render().to_string();
    let first = text.lines().next().unwrap_or("invalid arguments");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    StartError::new("usage", format!("{first} (see: dspark serve --help)"))
}

/// Colour in the logs only on a terminal, and never with `NO_COLOR` set (no-color.org): a log
/// written to a file or a pipe stays plain text.
fn colour() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour())
        .with_target(false)
        .try_init();
}

/// Start the engine thread: the echo engine (`--fake-engine`, with the `test-engine`
/// feature) or the native one.
#[cfg_attr(not(feature = "test-engine"), allow(unused_variables))]
fn start_engine(
    args: &ServeArgs,
    target: &Path,
    drafter: &Path,
    model: &ModelInfo,
    metrics: Arc<ServerMetrics>,
) -> Result<EngineHandle, StartError> {
    let limit = args.max_running.saturating_add(args.max_queue);
    #[cfg(feature = "test-engine")]
    if args.fake_engine {
        let config = FakeConfig {
            vocab_size: model.vocab_size,
            max_running: args.max_running,
            drafts: args.num_speculative_tokens.unwrap_or(4).min(4),
            accepted: 2,
            step_delay: Duration::from_millis(args.fake_step_ms),
            kv_tokens: args.kv_tokens,
            poison: None,
        };
        return EngineHandle::spawn(move || Ok(FakeEngine::new(config)), limit, metrics);
    }
    let (target, drafter) = (target.to_path_buf(), drafter.to_path_buf());
    let (device, config) = (args.device.clone(), load::engine_config(args));
    let (dtype, kv_dtype) = (args.dtype, args.kv_dtype);
    EngineHandle::spawn(
        move || -> Result<Box<dyn ServingEngine>, StartError> {
            // Said on a terminal while it runs (a large pair takes seconds); a log file or a
            // pipe gets only the lines scripts read.
            let tty = std::io::stderr().is_terminal();
            if tty {
                eprint!(
                    "dspark serve: loading {} ({}) ...",
                    target.display(),
                    dtype.name()
                );
            }
            let t0 = std::time::Instant::now();
            let loaded = load::load_pair(&target, &drafter, &device, (dtype, kv_dtype));
            if tty {
                match &loaded {
                    Ok(_) => eprintln!(" done ({:.1} s)", t0.elapsed().as_secs_f64()),
                    Err(_) => eprint!("\r\x1b[K"),
                }
            }
            let (t, d) = loaded?;
            engine_adapter::native_engine(t, d, config)
        },
        limit,
        metrics,
    )
}

fn run(args: &ServeArgs, bundled: Option<&Path>) -> Result<(), StartError> {
    let (target, drafter) = load::pair_dirs(args, bundled)?;
    let model = ModelInfo::load(&target, args.served_model_name.clone(), args.max_model_len)?;
    if !(args.shutdown_timeout.is_finite() && args.shutdown_timeout >= 0.0) {
        return Err(StartError::new("usage", "--shutdown-timeout must be >= 0"));
    }
    let timeout = Duration::from_secs_f64(args.shutdown_timeout.min(86_400.0));
    load::set_threads(args.threads);
    let metrics = Arc::new(ServerMetrics::default());
    let engine = start_engine(args, &target, &drafter, &model, Arc::clone(&metrics))?;
    let addr = SocketAddr::new(args.host, args.port);
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| StartError::new("bind", format!("cannot listen on {addr}: {e}")))?;
    let bound = listener.local_addr().unwrap_or(addr);
    let no_drafting = args.num_speculative_tokens == Some(0);
    let name = model.name.clone();
    let state = AppState::new(engine, model, metrics, args.max_body_bytes, no_drafting);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("dspark-http")
        .enable_all()
        .build()
        .map_err(|e| StartError::new("io", format!("cannot start the async runtime: {e}")))?;
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        #[cfg(feature = "test-engine")]
        let engine = if args.fake_engine {
            "test echo engine"
        } else {
            "native engine"
        };
        #[cfg(not(feature = "test-engine"))]
        let engine = "native engine";
        eprintln!("dspark serve: listening on http://{bound} (model {name}, {engine})");
        let stop = async move {
            let which = shutdown::signal().await;
            tracing::info!("{which}: shutting down (in-flight requests get {timeout:?})");
        };
        server::serve(listener, state.clone(), stop, timeout).await
    });
    let stopped = state.engine.join(timeout + shutdown::DRAIN_MARGIN);
    runtime.shutdown_timeout(Duration::from_secs(1));
    served.map_err(|e| StartError::new("io", format!("the server failed: {e}")))?;
    if !stopped {
        tracing::warn!("the engine thread did not stop in time; exiting anyway");
    }
    eprintln!("dspark serve: stopped");
    Ok(())
}
