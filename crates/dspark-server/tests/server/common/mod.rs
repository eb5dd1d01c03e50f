//! Shared helpers of the HTTP tests: a server on 127.0.0.1:0 over the echo engine and the
//! bundled target's tokenizer, an HTTP client, SSE parsing and raw-socket requests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dspark_server::engine_thread::EngineHandle;
use dspark_server::fake::{FakeConfig, FakeEngine};
use dspark_server::metrics::ServerMetrics;
use dspark_server::model::ModelInfo;
use dspark_server::server::Running;
use dspark_server::state::AppState;
use serde_json::Value;

/// The bundled pair's target directory (tokenizer, config).
pub fn bundled_target() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../python/dspark/models/tiny/target")
}

/// What a test server is built from.
pub struct Setup {
    pub fake: FakeConfig,
    pub limit: usize,
    pub max_model_len: Option<usize>,
    pub max_body_bytes: usize,
    pub shutdown_timeout: Duration,
    pub target: PathBuf,
}

impl Setup {
    /// The default setup over the target directory `dir`.
    pub fn for_target(dir: &Path) -> Self {
        Self {
            target: dir.to_path_buf(),
            ..Self::default()
        }
    }

    /// The default setup over an echo engine that spends `step_ms` on every step.
    pub fn slow(step_ms: u64) -> Self {
        Self {
            fake: FakeConfig {
                step_delay: Duration::from_millis(step_ms),
                ..FakeConfig::default()
            },
            ..Self::default()
        }
    }
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            fake: FakeConfig::default(),
            limit: 64,
            max_model_len: None,
            max_body_bytes: 1 << 20,
            shutdown_timeout: Duration::from_secs(5),
            target: bundled_target(),
        }
    }
}

/// A running test server.
pub struct Server {
    pub running: Running,
    pub state: AppState,
    pub client: reqwest::Client,
}

impl Server {
    pub async fn start(setup: Setup) -> Self {
        let model = ModelInfo::load(&setup.target, Some("tiny".into()), setup.max_model_len)
            .expect("model info");
        let metrics = Arc::new(ServerMetrics::default());
        let fake = setup.fake.clone();
        let engine = EngineHandle::spawn(
            move || Ok(FakeEngine::new(fake)),
            setup.limit,
            Arc::clone(&metrics),
        )
        .expect("engine thread");
        let state = AppState::new(engine, model, metrics, setup.max_body_bytes, false);
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let running = Running::start(state.clone(), addr, setup.shutdown_timeout)
            .await
            .expect("bind");
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        Self {
            running,
            state,
            client,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.running.addr)
    }

    /// POST `body` (JSON) to `path`: the response, its body unread.
    pub async fn send(&self, path: &str, body: &Value) -> reqwest::Response {
        send_json(&self.client, self.url(path), body).await
    }

    /// POST `body` (JSON) to `path`: status, headers and the JSON answer.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
        let r = self.send(path, body).await;
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let json = r.json::<Value>().await.unwrap_or(Value::Null);
        (status, headers, json)
    }

    /// POST raw bytes to `path`: status and the JSON answer.
    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> (u16, Value) {
        let r = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap_or(Value::Null))
    }

    /// GET `path` as text.
    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let r = self.client.get(self.url(path)).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    /// POST a streaming request; the `data:` payloads in order.
    pub async fn stream(&self, path: &str, body: &Value) -> (u16, Vec<String>) {
        let r = self.send(path, body).await;
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, sse_data(&text))
    }

    /// A metric's value from /metrics (the first sample whose line starts with `prefix`).
    pub async fn metric(&self, prefix: &str) -> f64 {
        let (_, text) = self.get_text("/metrics").await;
        metric_value(&text, prefix).unwrap_or_else(|| panic!("no metric {prefix}\n{text}"))
    }

    /// Whether the server still answers a small completion correctly.
    pub async fn still_serves(&self) {
        let (status, _, body) = self
            .post(
                "/v1/completions",
                &serde_json::json!({"prompt": "ok then", "max_tokens": 3}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["finish_reason"], "length");
    }
}

/// POST `body` (JSON) to `url` with `client`: the response, its body unread.
pub async fn send_json(client: &reqwest::Client, url: String, body: &Value) -> reqwest::Response {
    client.post(url).json(body).send().await.unwrap()
}

/// Shut `running` down, failing the test unless it is done within `secs` seconds.
pub async fn shutdown_within(running: Running, secs: u64) {
    tokio::time::timeout(Duration::from_secs(secs), running.shutdown())
        .await
        .expect("shutdown within its bound")
        .expect("served");
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|event| {
            let lines: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|l| l.strip_prefix(' ').unwrap_or(l))
                .collect();
            (!lines.is_empty()).then(|| lines.join("\n"))
        })
        .collect()
}

/// The value of the first sample line starting with `prefix`.
pub fn metric_value(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Send raw bytes on a fresh connection and read the whole response (the server closes it).
pub async fn raw_request(addr: SocketAddr, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let request = request.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&request).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    })
    .await
    .unwrap()
}

/// A minimal HTTP/1.1 POST with `Connection: close`.
pub fn http_post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// A target directory like the bundled one plus a `tokenizer_config.json` holding
/// `config` (links to the bundled files).
pub fn target_with_config(config: &Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "model.safetensors",
    ] {
        link(&bundled_target().join(f), &dir.path().join(f));
    }
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

fn link(from: &Path, to: &Path) {
    #[cfg(unix)]
    std::os::unix::fs::symlink(from, to).unwrap();
    #[cfg(not(unix))]
    std::fs::copy(from, to).map(drop).unwrap();
}

/// The bundled tokenizer's ids of `text` (no special tokens).
pub fn encode(text: &str) -> Vec<u32> {
    static TOKENIZER: std::sync::OnceLock<tokenizers::Tokenizer> = std::sync::OnceLock::new();
    let tok = TOKENIZER.get_or_init(|| {
        tokenizers::Tokenizer::from_file(bundled_target().join("tokenizer.json")).unwrap()
    });
    tok.encode(text, false).unwrap().get_ids().to_vec()
}

/// The parsed chunks of a stream's `data` events, checking that `[DONE]` ends it.
pub fn sse_chunks(data: &[String]) -> Vec<Value> {
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}
