//! `n` choices over HTTP on the echo engine: each choice its own stream of draws (seeded:
//! reproducible and different from each other), its own finish and figures, streamed
//! interleaved with their indexes, the usage counting the prompt once; bad `n` and a queue too
//! small for the choices are errors, and the server keeps serving.

use std::collections::BTreeMap;

use crate::common::{Server, Setup, encode, sse_chunks};
use dspark_server::fake::FakeConfig;
use serde_json::json;

#[tokio::test]
async fn seeded_choices_differ_repeat_and_stream_with_their_indexes() {
    let s = Server::start(Setup::default()).await;
    let prompt = encode("a b c d e f g h i j k l m n o p q r s t u v w x y z");
    let body = json!({"prompt": prompt, "max_tokens": 6, "temperature": 0.8, "seed": 11, "n": 4});
    let (status, _, a) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{a}");
    let texts: Vec<&str> = (0..4)
        .map(|i| {
            assert_eq!(a["choices"][i]["index"], i);
            assert_eq!(a["choices"][i]["finish_reason"], "length");
            assert!(a["choices"][i]["dspark"].is_object());
            a["choices"][i]["text"].as_str().unwrap()
        })
        .collect();
    let distinct: std::collections::HashSet<&&str> = texts.iter().collect();
    assert_eq!(distinct.len(), 4, "{texts:?}");
    assert_eq!(a["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(a["usage"]["completion_tokens"], 24);
    let (_, _, b) = s.post("/v1/completions", &body).await;
    assert_eq!(
        a["choices"], b["choices"],
        "a seeded request repeats, choice by choice"
    );
    // Choice 0 is the n = 1 request's.
    let mut one = body.clone();
    one["n"] = json!(1);
    let (_, _, c) = s.post("/v1/completions", &one).await;
    assert_eq!(c["choices"][0]["text"], a["choices"][0]["text"]);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, data) = s.stream("/v1/completions", &streamed).await;
    assert_eq!(status, 200);
    let all = sse_chunks(&data);
    let mut by_choice: BTreeMap<u64, String> = BTreeMap::new();
    let mut finished = 0;
    for c in &all[..all.len() - 1] {
        let ch = &c["choices"][0];
        let i = ch["index"].as_u64().unwrap();
        by_choice
            .entry(i)
            .or_default()
            .push_str(ch["text"].as_str().unwrap());
        if !ch["finish_reason"].is_null() {
            finished += 1;
        }
    }
    assert_eq!(finished, 4);
    let got: Vec<&str> = by_choice.values().map(String::as_str).collect();
    assert_eq!(got, texts);
    assert_eq!(all.last().unwrap()["usage"], a["usage"]);
}

#[tokio::test]
async fn chat_choices_open_each_with_the_role() {
    let s = Server::start(Setup::default()).await;
    let body = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3,
                      "n": 3, "stream": true});
    let (status, data) = s.stream("/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    let opened: Vec<u64> = sse_chunks(&data)
        .iter()
        .filter(|c| c["choices"][0]["delta"]["role"] == "assistant")
        .map(|c| c["choices"][0]["index"].as_u64().unwrap())
        .collect();
    assert_eq!(opened, vec![0, 1, 2]);
    let whole =
        json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "n": 2});
    let (status, _, r) = s.post("/v1/chat/completions", &whole).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"].as_array().unwrap().len(), 2);
    assert_eq!(r["choices"][1]["index"], 1);
}

#[tokio::test]
async fn bad_n_and_a_queue_too_small_are_errors() {
    let s = Server::start(Setup {
        limit: 3,
        fake: FakeConfig::default(),
        ..Setup::default()
    })
    .await;
    for n in [json!(0), json!(17), json!(10_000), json!(-1)] {
        let (status, _, e) = s
            .post("/v1/completions", &json!({"prompt": "x", "n": n}))
            .await;
        assert_eq!(status, 400, "{n}: {e}");
        assert_eq!(e["error"]["param"], "n");
    }
    // Four choices need four slots of a queue of three.
    let (status, _, e) = s
        .post("/v1/completions", &json!({"prompt": "x", "n": 4}))
        .await;
    assert_eq!(status, 429, "{e}");
    s.still_serves().await;
}
