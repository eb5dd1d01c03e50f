//! `GET /metrics`: the engine's counters and the server's latency histograms in Prometheus'
//! text format, named after vLLM's metrics with the `dspark:` prefix.
//!
//! From the engine ([`EngineMetrics`], as of its last step): `num_requests_running` /
//! `_waiting`, `kv_cache_usage_perc`, `num_preemptions_total`, `prompt_tokens_total`,
//! `generation_tokens_total`, `spec_decode_num_drafts_total`, `..._num_draft_tokens_total`,
//! `..._num_accepted_tokens_total`, `..._num_accepted_tokens_per_pos_total{position}`,
//! `engine_steps_total`, `engine_requests_aborted_total`.
//!
//! From the server: `time_to_first_token_seconds`, `time_per_output_token_seconds` (one
//! observation per request: its mean time per token after the first),
//! `e2e_request_latency_seconds`, `request_success_total{finished_reason}`,
//! `request_aborts_total{cause}` (aborts the server asked of the engine: a client gone, an
//! error; a stop string's match is a finish, counted in `request_success_total{stop}`),
//! `request_rejections_total{reason}` (429 and 503 answers), `server_requests_in_flight`.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dspark::engine::EngineMetrics;

/// vLLM's time-to-first-token buckets, with finer ones below 1 ms for small CPU models.
const TTFT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
    5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's time-per-output-token buckets, with finer ones below 10 ms.
const TPOT_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// vLLM's end-to-end latency buckets, with finer ones below 0.3 s.
const E2E_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
];

/// Why the server aborted a request in the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortCause {
    /// The client went away (its response stream was dropped).
    ClientDisconnect,
    /// The server failed on the request (detokenization).
    Error,
}

/// How a request ended, for `request_success_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A stop id or a stop string.
    Stop,
    /// Its token budget.
    Length,
    /// Aborted by the server (shutdown).
    Abort,
}

#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }
}

/// The server's own counters and histograms.
#[derive(Debug)]
pub struct ServerMetrics {
    ttft: Mutex<Histogram>,
    tpot: Mutex<Histogram>,
    e2e: Mutex<Histogram>,
    success: [AtomicU64; 3],
    aborts: [AtomicU64; 2],
    rejected: [AtomicU64; 2],
}

impl Default for ServerMetrics {
    fn default() -> Self {
        Self {
            ttft: Mutex::new(Histogram::new(TTFT_BUCKETS)),
            tpot: Mutex::new(Histogram::new(TPOT_BUCKETS)),
            e2e: Mutex::new(Histogram::new(E2E_BUCKETS)),
            success: Default::default(),
            aborts: Default::default(),
            rejected: Default::default(),
        }
    }
}

fn observe(h: &Mutex<Histogram>, v: f64) {
    h.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .observe(v);
}

impl ServerMetrics {
    /// A request ended: its outcome, time to first token, mean time per later token, and
    /// end-to-end latency.
    pub fn finished(
        &self,
        outcome: Outcome,
        ttft: Option<Duration>,
        tpot: Option<Duration>,
        e2e: Duration,
    ) {
        self.success[outcome as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(t) = ttft {
            observe(&self.ttft, t.as_secs_f64());
        }
        if let Some(t) = tpot {
            observe(&self.tpot, t.as_secs_f64());
        }
        observe(&self.e2e, e2e.as_secs_f64());
    }

    /// The server aborted a request in the engine.
    pub fn count_abort(&self, cause: AbortCause) {
        self.aborts[cause as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A request was refused before the engine saw it: `queue_full` (429) or not (503).
    pub fn count_rejected(&self, queue_full: bool) {
        self.rejected[usize::from(!queue_full)].fetch_add(1, Ordering::Relaxed);
    }

    /// Aborts for `cause` so far.
    pub fn aborts(&self, cause: AbortCause) -> u64 {
        self.aborts[cause as usize].load(Ordering::Relaxed)
    }
}

/// Prometheus text, one family at a time.
struct Writer {
    out: String,
    labels: String,
}

impl Writer {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, extra: &str, value: f64) {
        let sep = if extra.is_empty() { "" } else { "," };
        let _ = writeln!(self.out, "{name}{{{}{sep}{extra}}} {value}", self.labels);
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, "", value);
    }

    /// A counter family with one sample per value of `label`: `values[i]` counted in
    /// `counts[i]`.
    fn counters(
        &mut self,
        name: &str,
        help: &str,
        label: &str,
        values: &[&str],
        counts: &[AtomicU64],
    ) {
        self.family(name, "counter", help);
        for (value, count) in values.iter().zip(counts) {
            self.sample(
                name,
                &format!("{label}=\"{value}\""),
                count.load(Ordering::Relaxed) as f64,
            );
        }
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Mutex<Histogram>) {
        let h = h.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.family(name, "histogram", help);
        let mut cumulative = 0;
        for (b, c) in h.bounds.iter().zip(&h.counts) {
            cumulative += c;
            self.sample(
                &format!("{name}_bucket"),
                &format!("le=\"{b}\""),
                cumulative as f64,
            );
        }
        self.sample(&format!("{name}_bucket"), "le=\"+Inf\"", h.count as f64);
        self.sample(&format!("{name}_sum"), "", h.sum);
        self.sample(&format!("{name}_count"), "", h.count as f64);
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The whole `/metrics` page.
pub fn render(
    model: &str,
    engine: &EngineMetrics,
    server: &ServerMetrics,
    in_flight: usize,
) -> String {
    let mut w = Writer {
        out: String::new(),
        labels: format!("model_name=\"{}\"", escape(model)),
    };
    let e = engine;
    w.one(
        "dspark:num_requests_running",
        "gauge",
        "Requests in the engine's running batch.",
        e.requests_running as f64,
    );
    w.one(
        "dspark:num_requests_waiting",
        "gauge",
        "Requests admitted by the engine and waiting for room.",
        e.requests_waiting as f64,
    );
    if let Some(cap) = e.kv_tokens_capacity.filter(|&c| c > 0) {
        w.one(
            "dspark:kv_cache_usage_perc",
            "gauge",
            "KV cache usage: 1 means full.",
            e.kv_tokens_used as f64 / cap as f64,
        );
    }
    w.one(
        "dspark:kv_cache_tokens",
        "gauge",
        "KV cache tokens held by running requests.",
        e.kv_tokens_used as f64,
    );
    w.one(
        "dspark:num_preemptions_total",
        "counter",
        "Preemptions (a running request's cache dropped for room).",
        e.preemptions as f64,
    );
    w.one(
        "dspark:prompt_tokens_total",
        "counter",
        "Prompt tokens prefilled.",
        e.prompt_tokens as f64,
    );
    w.one(
        "dspark:generation_tokens_total",
        "counter",
        "Tokens generated.",
        e.generation_tokens as f64,
    );
    w.one(
        "dspark:spec_decode_num_drafts_total",
        "counter",
        "Drafted request-rounds (one per request per round whose block was verified).",
        e.num_drafts as f64,
    );
    w.one(
        "dspark:spec_decode_num_draft_tokens_total",
        "counter",
        "Draft tokens sent to verification.",
        e.num_draft_tokens as f64,
    );
    w.one(
        "dspark:spec_decode_num_accepted_tokens_total",
        "counter",
        "Draft tokens accepted.",
        e.num_accepted_tokens as f64,
    );
    let name = "dspark:spec_decode_num_accepted_tokens_per_pos_total";
    w.family(name, "counter", "Accepted draft tokens per draft position.");
    for (k, n) in e.num_accepted_tokens_per_pos.iter().enumerate() {
        w.sample(name, &format!("position=\"{k}\""), *n as f64);
    }
    w.one(
        "dspark:engine_steps_total",
        "counter",
        "Engine steps (rounds over the running batch).",
        e.steps as f64,
    );
    w.one(
        "dspark:engine_requests_aborted_total",
        "counter",
        "Requests the engine aborted.",
        e.requests_aborted as f64,
    );
    w.one(
        "dspark:engine_requests_failed_total",
        "counter",
        "Requests that ended alone because their own rows failed a check (non-finite logits).",
        e.requests_failed as f64,
    );
    w.one(
        "dspark:server_requests_in_flight",
        "gauge",
        "Requests holding a server slot (running or queued).",
        in_flight as f64,
    );

    let s = server;
    w.counters(
        "dspark:request_success_total",
        "Finished requests by finish reason.",
        "finished_reason",
        &["stop", "length", "abort"],
        &s.success,
    );
    w.counters(
        "dspark:request_aborts_total",
        "Requests the server aborted in the engine, by cause.",
        "cause",
        &["client_disconnect", "error"],
        &s.aborts,
    );
    w.counters(
        "dspark:request_rejections_total",
        "Requests refused before the engine: queue_full (429), unavailable (503).",
        "reason",
        &["queue_full", "unavailable"],
        &s.rejected,
    );
    w.histogram(
        "dspark:time_to_first_token_seconds",
        "Time from arrival to the first token.",
        &s.ttft,
    );
    w.histogram(
        "dspark:time_per_output_token_seconds",
        "Mean time per output token after the first, one observation per request.",
        &s.tpot,
    );
    w.histogram(
        "dspark:e2e_request_latency_seconds",
        "Time from arrival to the last token.",
        &s.e2e,
    );
    w.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_format() {
        let engine = EngineMetrics {
            requests_running: 2,
            num_drafts: 3,
            num_accepted_tokens_per_pos: vec![5, 1],
            kv_tokens_capacity: Some(100),
            kv_tokens_used: 25,
            ..EngineMetrics::default()
        };
        let server = ServerMetrics::default();
        server.finished(
            Outcome::Stop,
            Some(Duration::from_millis(3)),
            None,
            Duration::from_millis(20),
        );
        server.count_abort(AbortCause::ClientDisconnect);
        let text = render("m\"x", &engine, &server, 1);
        for line in [
            "dspark:num_requests_running{model_name=\"m\\\"x\"} 2",
            "dspark:kv_cache_usage_perc{model_name=\"m\\\"x\"} 0.25",
            "dspark:spec_decode_num_drafts_total{model_name=\"m\\\"x\"} 3",
            "dspark:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\\\"x\",position=\"1\"} 1",
            "dspark:request_success_total{model_name=\"m\\\"x\",finished_reason=\"stop\"} 1",
            "dspark:request_aborts_total{model_name=\"m\\\"x\",cause=\"client_disconnect\"} 1",
            "dspark:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"0.0025\"} 0",
            "dspark:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"0.005\"} 1",
            "dspark:time_to_first_token_seconds_bucket{model_name=\"m\\\"x\",le=\"+Inf\"} 1",
            "dspark:time_per_output_token_seconds_count{model_name=\"m\\\"x\"} 0",
            "# TYPE dspark:e2e_request_latency_seconds histogram",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }
}
