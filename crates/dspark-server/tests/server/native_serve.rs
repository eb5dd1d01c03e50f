//! The server on the native engine over the bundled pair (the real `Qwen3Target` and
//! `Qwen3Drafter`): greedy text through HTTP equals the engine's own output for the same
//! prompt, and a seeded sampled request gives the same text alone and among other traffic.

use crate::common;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dspark::engine::{Engine, EngineConfig, RequestSpec};
use dspark_server::cli::Dtype;
use dspark_server::engine_adapter::native_engine;
use dspark_server::engine_thread::EngineHandle;
use dspark_server::load::{SOURCE_BUNDLED_DIR, load_pair};
use dspark_server::metrics::ServerMetrics;
use dspark_server::model::ModelInfo;
use dspark_server::server::Running;
use dspark_server::state::AppState;
use serde_json::{Value, json};

fn dirs() -> (std::path::PathBuf, std::path::PathBuf) {
    let root = std::path::PathBuf::from(SOURCE_BUNDLED_DIR);
    (root.join("target"), root.join("drafter"))
}

async fn start() -> (Running, reqwest::Client) {
    let (t, d) = dirs();
    let model = ModelInfo::load(&t, Some("tiny".into()), None).expect("model info");
    let metrics = Arc::new(ServerMetrics::default());
    let engine = EngineHandle::spawn(
        move || {
            let (target, drafter) = load_pair(&t, &d, "cpu", (Dtype::Float32, None))?;
            native_engine(target, drafter, EngineConfig::default())
        },
        64,
        Arc::clone(&metrics),
    )
    .expect("the native engine starts");
    let state = AppState::new(engine, model, metrics, 1 << 20, false);
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let running = Running::start(state, addr, Duration::from_secs(5))
        .await
        .unwrap();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    (running, client)
}

async fn complete(client: &reqwest::Client, addr: SocketAddr, body: Value) -> Value {
    let r = client
        .post(format!("http://{addr}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

/// The engine's own greedy tokens for `prompt`, stopping at the model's end ids.
fn offline(prompt: &[u32], max_new: usize, eos: &[u32]) -> Vec<u32> {
    let (t, d) = dirs();
    let (target, drafter) = load_pair(&t, &d, "cpu", (Dtype::Float32, None)).unwrap();
    let mut engine = Engine::new(target, drafter, EngineConfig::default()).unwrap();
    let mut spec = RequestSpec::new(prompt.to_vec(), max_new);
    spec.stop_token_ids = eos.to_vec();
    engine.add_request(spec).unwrap();
    let mut out = Vec::new();
    while engine.has_work() {
        for o in engine.step().unwrap().outputs {
            out.extend(o.new_tokens);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_http_text_equals_the_engine_and_seeds_ignore_other_traffic() {
    let (running, client) = start().await;
    let addr = running.addr;
    let (t, _) = dirs();
    let model = ModelInfo::load(&t, None, None).unwrap();
    let prompt = common::encode("import os\nimport sys\n\ndef main(");
    let answer = complete(
        &client,
        addr,
        json!({"prompt": prompt, "max_tokens": 24, "temperature": 0}),
    )
    .await;
    let ids = offline(&prompt, 24, &model.eos_ids);
    let want = model.tokenizer.decode(&ids, true).unwrap();
    assert_eq!(answer["choices"][0]["text"].as_str().unwrap(), want);
    assert_eq!(answer["usage"]["completion_tokens"], ids.len());
    assert!(answer["choices"][0]["dspark"]["rounds"].as_u64().unwrap() > 0);

    // A seeded sampled request: alone, then while other requests run.
    let seeded = json!({"prompt": "class Foo(object):\n    def ", "max_tokens": 16,
        "temperature": 0.9, "top_p": 0.95, "seed": 1234});
    let alone = complete(&client, addr, seeded.clone()).await;
    let mut others = Vec::new();
    for i in 0..3 {
        let (client, body) = (
            client.clone(),
            json!({"prompt": format!("def f{i}(x):\n"),
            "max_tokens": 20, "temperature": 1.0, "seed": i}),
        );
        others.push(tokio::spawn(
            async move { complete(&client, addr, body).await },
        ));
    }
    let busy = complete(&client, addr, seeded).await;
    for o in others {
        o.await.unwrap();
    }
    assert_eq!(alone["choices"][0]["text"], busy["choices"][0]["text"]);
    running.shutdown().await.unwrap();
}
