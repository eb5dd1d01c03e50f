//! Log-probabilities over HTTP, on the echo engine's fixed distribution (each token at
//! `-ln 2`, the alternatives `t + k` at `-(k + 1) ln 2`): both endpoints' shapes, whole and
//! streamed alike, the count checks, and null when not asked for.

use crate::common::{Server, Setup, encode, sse_chunks};
use serde_json::{Value, json};

const LN2: f64 = std::f64::consts::LN_2;

fn close(v: &Value, want: f64) -> bool {
    (v.as_f64().unwrap() - want).abs() < 1e-6
}

#[tokio::test]
async fn completion_logprobs_whole_and_streamed() {
    let s = Server::start(Setup::default()).await;
    let prompt = encode("one two three four five six");
    let body = json!({"prompt": prompt, "max_tokens": 7, "temperature": 0, "logprobs": 3});
    let (status, _, whole) = s.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    let choice = &whole["choices"][0];
    let lp = &choice["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), 7);
    assert_eq!(tokens.concat(), choice["text"].as_str().unwrap());
    assert!(
        lp["token_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| close(v, -LN2))
    );
    let mut offset = 0;
    for (k, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 3, "{top:?}");
        // The emitted token is the likeliest of its alternatives.
        assert!(close(&top[tokens[k]], -LN2), "{top:?}");
        assert_eq!(lp["text_offset"][k], offset);
        offset += tokens[k].chars().count();
    }

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, data) = s.stream("/v1/completions", &streamed).await;
    assert_eq!(status, 200);
    let mut joined =
        json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    for c in sse_chunks(&data) {
        let piece = &c["choices"][0]["logprobs"];
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            let all = joined[key].as_array_mut().unwrap();
            all.extend(piece[key].as_array().unwrap().iter().cloned());
        }
    }
    assert_eq!(
        &joined, lp,
        "the chunks carry the whole answer's entries, offsets running on"
    );
}

#[tokio::test]
async fn chat_logprobs_whole_and_streamed() {
    let s = Server::start(Setup::default()).await;
    let body = json!({
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 2,
    });
    let (status, _, whole) = s.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    let choice = &whole["choices"][0];
    let content = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len(),
        whole["usage"]["completion_tokens"].as_u64().unwrap() as usize
    );
    let mut bytes = Vec::new();
    for e in content {
        assert!(close(&e["logprob"], -LN2));
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["token"], e["token"]);
        assert!(close(&top[1]["logprob"], -2.0 * LN2));
        bytes.extend(
            e["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8),
        );
    }
    assert_eq!(
        String::from_utf8(bytes).unwrap(),
        choice["message"]["content"].as_str().unwrap()
    );

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, data) = s.stream("/v1/chat/completions", &streamed).await;
    assert_eq!(status, 200);
    let got: Vec<Value> = sse_chunks(&data)
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(&got, content);
    // Without logprobs: null, whole and streamed.
    let plain = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    let (_, _, r) = s.post("/v1/chat/completions", &plain).await;
    assert!(r["choices"][0]["logprobs"].is_null(), "{r}");
}

#[tokio::test]
async fn bad_counts_are_400s_naming_the_field() {
    let s = Server::start(Setup::default()).await;
    let msg = json!([{"role": "user", "content": "hi"}]);
    for (path, body, param) in [
        (
            "/v1/chat/completions",
            json!({"messages": msg, "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msg, "logprobs": true, "top_logprobs": -1}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msg, "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logprobs": 21}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logprobs": 1.5}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logprobs": "3"}),
            "logprobs",
        ),
    ] {
        let (status, _, e) = s.post(path, &body).await;
        assert_eq!(status, 400, "{body}: {e}");
        assert_eq!(e["error"]["param"], param, "{e}");
    }
    s.still_serves().await;
}
