//! `response_format` over HTTP: each kind is accepted (the echo engine ignores the grammar;
//! the native engine's tests check what it does), and a schema that does not compile, a regex
//! that can never match, or an unknown type is a 400 naming the field, the server serving on.

use crate::common::{Server, Setup};
use serde_json::json;

#[tokio::test]
async fn formats_are_accepted_and_bad_ones_are_400s() {
    let s = Server::start(Setup::default()).await;
    let msg = json!([{"role": "user", "content": "hi"}]);
    for format in [
        json!({"type": "text"}),
        json!({"type": "json_object"}),
        json!({"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}),
        json!({"type": "regex", "regex": "[a-z]+"}),
        json!({"type": "grammar", "grammar": "start: \"yes\" | \"no\""}),
    ] {
        let body = json!({"messages": msg, "max_tokens": 2, "response_format": format});
        let (status, _, r) = s.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{format}: {r}");
        let body = json!({"prompt": "x", "max_tokens": 2, "response_format": format});
        let (status, _, r) = s.post("/v1/completions", &body).await;
        assert_eq!(status, 200, "{format}: {r}");
    }
    for format in [
        json!({"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}),
        json!({"type": "regex", "regex": "a("}),
        json!({"type": "regex", "regex": "[a&&b]"}),
        json!({"type": "grammar", "grammar": "start: undefined_rule"}),
        json!({"type": "yaml"}),
    ] {
        let body = json!({"messages": msg, "response_format": format});
        let (status, _, e) = s.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{format}: {e}");
        assert_eq!(e["error"]["param"], "response_format", "{e}");
        s.still_serves().await;
    }
}
