//! The HTTP API over the deterministic echo engine: completions and chat, streamed and not,
//! usage and dspark figures, stop strings, seeds, typed errors, disconnects, the queue limit
//! and graceful shutdown. Every server binds 127.0.0.1 on port 0.

use std::time::Duration;

use crate::common;
use crate::common::{Server, Setup, encode, http_post, raw_request, target_with_config};
use dspark_server::fake::FakeConfig;
use serde_json::{Value, json};

const RUNNING: &str = "dspark:num_requests_running{";
const DISCONNECTS: &str =
    "dspark:request_aborts_total{model_name=\"tiny\",cause=\"client_disconnect\"}";

/// The text of every chunk of a completion stream, and the parsed chunks.
fn stream_text(data: &[String]) -> (String, Vec<Value>) {
    let chunks = common::sse_chunks(data);
    let text = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    (text, chunks)
}

/// Check that the completion stream `body` (SSE text) ends with `[DONE]` after a chunk that
/// finishes with `length`.
fn assert_stream_runs_to_length(body: &str) {
    let (_, chunks) = stream_text(&common::sse_data(body));
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
}

#[tokio::test]
async fn completions_whole_and_streamed_agree_with_usage_and_figures() {
    let s = Server::start(Setup::default()).await;
    let prompt = encode("def main():\n    return 1");
    let body = json!({"model": "tiny", "prompt": prompt, "max_tokens": 9, "temperature": 0});
    let (status, _, whole) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "text_completion");
    let choice = &whole["choices"][0];
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(whole["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(whole["usage"]["completion_tokens"], 9);
    assert_eq!(whole["usage"]["total_tokens"], prompt.len() + 9);
    assert!(
        choice["dspark"]["acceptance_length"].as_f64().unwrap() > 1.0,
        "{choice}"
    );
    assert!(choice["dspark"]["drafted_tokens"].as_u64().unwrap() > 0);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, data) = s.stream("/v1/completions", &streamed).await;
    assert_eq!(status, 200);
    let (text, chunks) = stream_text(&data);
    assert_eq!(text, choice["text"].as_str().unwrap());
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], whole["usage"]);
    let finishing = &chunks[chunks.len() - 2]["choices"][0];
    assert_eq!(finishing["finish_reason"], "length");
    assert!(finishing["dspark"].is_object());
}

#[tokio::test]
async fn stop_strings_cut_the_text_and_finish_with_stop() {
    let s = Server::start(Setup::default()).await;
    let prompt = encode("alpha beta gamma delta");
    let body = json!({"prompt": prompt, "max_tokens": 20, "temperature": 0});
    let (_, _, full) = s.post("/v1/completions", &body).await;
    let full = full["choices"][0]["text"].as_str().unwrap().to_owned();
    let at = full.find("gamma").expect("the echo has gamma");
    for stream in [false, true] {
        let mut b = body.clone();
        b["stop"] = json!(["gamma", "never"]);
        b["stream"] = json!(stream);
        let (text, reason) = if stream {
            let (_, data) = s.stream("/v1/completions", &b).await;
            let (text, chunks) = stream_text(&data);
            let reason = chunks.last().unwrap()["choices"][0]["finish_reason"].clone();
            (text, reason)
        } else {
            let (_, _, r) = s.post("/v1/completions", &b).await;
            (
                r["choices"][0]["text"].as_str().unwrap().to_owned(),
                r["choices"][0]["finish_reason"].clone(),
            )
        };
        assert_eq!(text, full[..at], "stream {stream}");
        assert_eq!(reason, "stop");
    }
    // A match is a finish (`stop`), not an abort: the request ends in the engine, uncounted
    // among the aborts.
    let stops = "dspark:request_success_total{model_name=\"tiny\",finished_reason=\"stop\"}";
    assert!(s.metric(stops).await >= 2.0);
    let (_, metrics) = s.get_text("/metrics").await;
    assert!(!metrics.contains("stop_string"), "{metrics}");
    let aborts = "dspark:request_aborts_total{model_name=\"tiny\",cause=\"client_disconnect\"}";
    assert_eq!(s.metric(aborts).await, 0.0);
    // A stop id ends the request too.
    let mut b = body.clone();
    b["stop_token_ids"] = json!([prompt[2]]);
    let (_, _, r) = s.post("/v1/completions", &b).await;
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert_eq!(r["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn seeds_reproduce_and_differ() {
    let s = Server::start(Setup::default()).await;
    let body = |seed: u64| {
        json!({"prompt": encode("one two three four five six"), "max_tokens": 6,
        "temperature": 0.8, "seed": seed})
    };
    let (_, _, a) = s.post("/v1/completions", &body(3)).await;
    let (_, _, b) = s.post("/v1/completions", &body(3)).await;
    let (_, _, c) = s.post("/v1/completions", &body(4)).await;
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    assert_ne!(a["choices"][0]["text"], c["choices"][0]["text"]);
}

#[tokio::test]
async fn chat_needs_a_template_and_renders_it() {
    let msg =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0});
    // The bundled pair ships a chat template: chat works out of the box.
    let s = Server::start(Setup::default()).await;
    let (status, _, r) = s.post("/v1/chat/completions", &msg).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    // A target without one answers chat with a 400 that says so.
    let bare = target_with_config(&json!({}));
    let s = Server::start(Setup::for_target(bare.path())).await;
    let (status, _, e) = s.post("/v1/chat/completions", &msg).await;
    assert_eq!(status, 400, "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("template"),
        "{e}"
    );

    let template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}\
                    {% if add_generation_prompt %}<assistant>{% endif %}";
    let dir = target_with_config(&json!({"chat_template": template}));
    let s = Server::start(Setup::for_target(dir.path())).await;
    let (status, _, r) = s.post("/v1/chat/completions", &msg).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        r["usage"]["prompt_tokens"],
        encode("<user>hi\n<assistant>").len()
    );
    assert_eq!(r["usage"]["completion_tokens"], 4);
    let mut streamed = msg.clone();
    streamed["stream"] = json!(true);
    let (status, data) = s.stream("/v1/chat/completions", &streamed).await;
    assert_eq!(status, 200);
    let text: String = common::sse_chunks(&data)
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(
        text,
        r["choices"][0]["message"]["content"].as_str().unwrap()
    );
}

#[tokio::test]
async fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let s = Server::start(Setup {
        max_model_len: Some(64),
        max_body_bytes: 4096,
        ..Setup::default()
    })
    .await;
    let cases: Vec<(Vec<u8>, u16)> = vec![
        (b"{not json".to_vec(), 400),
        (br#"{"prompt": "x", "bogus": 1}"#.to_vec(), 422),
        (br#"{"prompt": "x", "max_tokens": "many"}"#.to_vec(), 422),
        (br#"{"prompt": "x", "max_tokens": -1}"#.to_vec(), 400),
        (
            br#"{"prompt": "x", "max_tokens": 100000000000}"#.to_vec(),
            400,
        ),
        (
            format!(r#"{{"prompt": {:?}}}"#, vec![5u32; 80]).into_bytes(),
            400,
        ),
        (br#"{"prompt": "x", "temperature": -1}"#.to_vec(), 400),
        (br#"{"prompt": "x", "n": 0}"#.to_vec(), 400),
        (b"{\"prompt\": \"\xff\xfe\"}".to_vec(), 400),
        (
            format!(r#"{{"prompt": "{}"}}"#, "a".repeat(10_000)).into_bytes(),
            413,
        ),
        (br#"{"prompt": "x", "model": "gpt-9"}"#.to_vec(), 404),
    ];
    for (body, want) in cases {
        let (status, e) = s.post_raw("/v1/completions", body.clone()).await;
        assert_eq!(status, want, "{} -> {e}", String::from_utf8_lossy(&body));
        let err = &e["error"];
        assert!(
            err["message"].is_string() && err["type"].is_string() && err["code"].is_string(),
            "{e}"
        );
        s.still_serves().await;
    }
    let (status, e) = s
        .post_raw(
            "/v1/completions",
            format!(r#"{{"prompt": {:?}, "max_tokens": 4}}"#, vec![5u32; 62]).into_bytes(),
        )
        .await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (400, Some("context_length_exceeded"))
    );
    let (status, text) = s.get_text("/v1/nothing").await;
    assert_eq!(status, 404, "{text}");
    // A bad request on a raw connection: an error body, then the connection closes.
    let answer = raw_request(
        s.running.addr,
        &http_post("/v1/completions", br#"{"prompt": "#),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    s.still_serves().await;
}

#[tokio::test]
async fn models_health_and_metrics() {
    let s = Server::start(Setup::default()).await;
    let (status, text) = s.get_text("/v1/models").await;
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(s.get_text("/v1/models/tiny").await.0, 200);
    assert_eq!(s.get_text("/v1/models/other").await.0, 404);
    assert_eq!(s.get_text("/health").await.0, 200);
    s.still_serves().await;
    let (_, metrics) = s.get_text("/metrics").await;
    for name in [
        "dspark:spec_decode_num_drafts_total",
        "dspark:spec_decode_num_draft_tokens_total",
        "dspark:spec_decode_num_accepted_tokens_total",
        "dspark:spec_decode_num_accepted_tokens_per_pos_total",
        "dspark:num_requests_running",
        "dspark:num_requests_waiting",
        "dspark:num_preemptions_total",
        "dspark:prompt_tokens_total",
        "dspark:generation_tokens_total",
        "dspark:time_to_first_token_seconds_bucket",
        "dspark:time_per_output_token_seconds_bucket",
        "dspark:e2e_request_latency_seconds_bucket",
    ] {
        assert!(metrics.contains(name), "no {name} in\n{metrics}");
    }
    assert!(s.metric("dspark:generation_tokens_total{").await >= 3.0);
}

/// Wait until `check` holds (polling every 20 ms, for 10 s at most).
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..500 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never: {what}");
}

#[tokio::test]
async fn a_client_that_disconnects_aborts_its_request_and_others_finish() {
    let s = Server::start(Setup::slow(10)).await;
    let long = json!({"prompt": encode("a b c d"), "max_tokens": 2000, "stream": true, "ignore_eos": true});
    let other = json!({"prompt": encode("x y z"), "max_tokens": 40, "stream": true});
    let other_task = {
        let client = s.client.clone();
        let url = s.url("/v1/completions");
        tokio::spawn(async move {
            let r = common::send_json(&client, url, &other).await;
            r.text().await.unwrap()
        })
    };
    let mut r = s.send("/v1/completions", &long).await;
    assert_eq!(r.status(), 200);
    let first = r.chunk().await.unwrap().expect("a first chunk");
    assert!(first.starts_with(b"data: "));
    drop(r);
    eventually("the disconnect is counted", async || {
        s.metric(DISCONNECTS).await >= 1.0
    })
    .await;
    assert_stream_runs_to_length(&other_task.await.unwrap());
    eventually("nothing runs", async || s.metric(RUNNING).await == 0.0).await;
    assert_eq!(s.state.engine.metrics().requests_aborted, 1);
    s.still_serves().await;
}

#[tokio::test]
async fn beyond_the_queue_limit_requests_get_429_with_retry_after() {
    let mut setup = Setup::slow(20);
    setup.fake.max_running = 1;
    setup.limit = 2;
    let s = Server::start(setup).await;
    let body =
        json!({"prompt": encode("a b"), "max_tokens": 30, "ignore_eos": true, "stream": true});
    let mut held = Vec::new();
    for _ in 0..2 {
        let r = s.send("/v1/completions", &body).await;
        assert_eq!(r.status(), 200);
        held.push(r);
    }
    let (status, headers, e) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 429, "{e}");
    assert!(headers.contains_key("retry-after"));
    assert_eq!(e["error"]["code"], "queue_full");
    for r in held {
        let data = common::sse_data(&r.text().await.unwrap());
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    }
    s.still_serves().await;
}

#[tokio::test]
async fn graceful_shutdown_finishes_in_flight_requests_and_refuses_new_ones() {
    let s = Server::start(Setup::slow(10)).await;
    let body =
        json!({"prompt": encode("a b c"), "max_tokens": 20, "ignore_eos": true, "stream": true});
    let r = s.send("/v1/completions", &body).await;
    assert_eq!(r.status(), 200);
    let reader = tokio::spawn(async move { r.text().await.unwrap() });
    let state = s.state.clone();
    common::shutdown_within(s.running, 20).await;
    assert_stream_runs_to_length(&reader.await.unwrap());
    assert!(!state.engine.is_accepting());
    assert!(state.engine.join(Duration::from_secs(5)));
}

#[tokio::test]
async fn shutdown_aborts_what_outlives_its_timeout() {
    let setup = Setup {
        shutdown_timeout: Duration::from_millis(200),
        ..Setup::slow(20)
    };
    let s = Server::start(setup).await;
    let body =
        json!({"prompt": encode("a b c"), "max_tokens": 5000, "ignore_eos": true, "stream": true});
    let r = s.send("/v1/completions", &body).await;
    let reader = tokio::spawn(async move { r.text().await.unwrap_or_default() });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let state = s.state.clone();
    common::shutdown_within(s.running, 10).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("the stream ended");
    assert!(state.engine.join(Duration::from_secs(5)));
    assert_eq!(state.engine.metrics().requests_running, 0);
}

#[tokio::test]
async fn a_request_that_fails_alone_gets_a_500_and_the_others_finish() {
    const POISON: u32 = 2999;
    let fake = FakeConfig {
        poison: Some(POISON),
        ..FakeConfig::default()
    };
    let s = Server::start(Setup {
        fake,
        ..Setup::default()
    })
    .await;
    let good = |i: usize| json!({"prompt": encode(&format!("good {i} a b c")), "max_tokens": 12, "temperature": 0});
    let solo: Vec<Value> = {
        let mut v = Vec::new();
        for i in 0..4 {
            v.push(s.post("/v1/completions", &good(i)).await.2);
        }
        v
    };
    let mut bad_prompt = encode("bad one");
    bad_prompt.push(POISON);
    let bad = json!({"prompt": bad_prompt, "max_tokens": 12});
    let mut bad_stream = bad.clone();
    bad_stream["stream"] = json!(true);
    let goods: Vec<_> = (0..4)
        .map(|i| {
            let (client, url, body) = (s.client.clone(), s.url("/v1/completions"), good(i));
            tokio::spawn(async move {
                let r = common::send_json(&client, url, &body).await;
                (r.status().as_u16(), r.json::<Value>().await.unwrap())
            })
        })
        .collect();
    let (status, _, whole) = s.post("/v1/completions", &bad).await;
    assert_eq!(status, 500, "{whole}");
    assert_eq!(whole["error"]["code"], "internal_error");
    assert!(
        whole["error"]["message"]
            .as_str()
            .unwrap()
            .contains("non-finite"),
        "{whole}"
    );
    let (status, data) = s.stream("/v1/completions", &bad_stream).await;
    assert_eq!(status, 200);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let err: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "internal_error", "{data:?}");
    for (i, g) in goods.into_iter().enumerate() {
        let (status, body) = g.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["choices"][0]["finish_reason"], "length");
        assert_eq!(body["choices"][0]["text"], solo[i]["choices"][0]["text"]);
    }
    assert_eq!(s.metric("dspark:engine_requests_failed_total").await, 2.0);
    eventually("nothing runs", async || s.metric(RUNNING).await == 0.0).await;
    s.still_serves().await;
}
