//! A bounded load test on loopback: 1,200 requests (streamed and not) from 48 concurrent
//! clients against a server that admits 16 at a time, over the echo engine. Every request
//! completes or is refused with 429/503; none is lost or hangs (each has a deadline, the
//! whole run too); resident memory after the load is within 10% of after a warm-up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../server/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Server, Setup, encode};
use serde_json::json;

const CLIENTS: usize = 48;

/// Resident set size in bytes (Linux; 0 elsewhere).
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

#[derive(Default)]
struct Tally {
    /// Requests that completed.
    ok: AtomicUsize,
    /// Requests refused on every try.
    refused: AtomicUsize,
    /// 429/503 answers in all.
    refusals: AtomicUsize,
}

/// `n` requests from [`CLIENTS`] tasks; panics on any other outcome or a hang.
async fn load(s: &Server, n: usize, tally: &Arc<Tally>) {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (client, url, next, tally) = (
            s.client.clone(),
            s.url("/v1/completions"),
            Arc::clone(&next),
            Arc::clone(tally),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return;
                }
                let stream = i % 2 == 0;
                let body = json!({"prompt": encode(&format!("request {i} of the load")),
                    "max_tokens": 4 + i % 13, "stream": stream, "ignore_eos": true});
                // A refused request is retried (as a client honouring Retry-After would, with
                // a shorter wait) up to 100 times, then counted as refused.
                let mut done = false;
                for _ in 0..100 {
                    let send = async {
                        let r = client.post(&url).json(&body).send().await.expect("sent");
                        let status = r.status().as_u16();
                        let text = r.text().await.expect("a whole body");
                        (status, text)
                    };
                    let (status, text) = tokio::time::timeout(Duration::from_secs(30), send)
                        .await
                        .unwrap_or_else(|_| panic!("request {i} hung"));
                    match status {
                        200 if stream => assert!(text.ends_with("data: [DONE]\n\n"), "{text}"),
                        200 => assert!(text.contains("\"finish_reason\":\"length\""), "{text}"),
                        429 | 503 => {
                            tally.refusals.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                        other => panic!("request {i}: {other} {text}"),
                    }
                    done = true;
                    break;
                }
                if !done {
                    tally.refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                tally.ok.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("a client task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_request_completes_or_is_refused_and_memory_stays_flat() {
    let mut setup = Setup::slow(1);
    setup.fake.max_running = 8;
    setup.limit = 16;
    let s = Server::start(setup).await;
    let run = async {
        let warm = Arc::new(Tally::default());
        load(&s, 200, &warm).await;
        let before = rss();
        let tally = Arc::new(Tally::default());
        load(&s, 1000, &tally).await;
        let after = rss();
        (warm, tally, before, after)
    };
    let (warm, tally, before, after) = tokio::time::timeout(Duration::from_secs(240), run)
        .await
        .expect("the load test ended in time");
    let ok = tally.ok.load(Ordering::Relaxed);
    let refused = tally.refused.load(Ordering::Relaxed);
    let refusals = tally.refusals.load(Ordering::Relaxed);
    eprintln!(
        "load: {ok} completed, {refused} refused ({refusals} 429/503 answers); RSS {before} -> {after} bytes"
    );
    assert_eq!(ok + refused, 1000, "lost requests");
    assert_eq!(
        warm.ok.load(Ordering::Relaxed) + warm.refused.load(Ordering::Relaxed),
        200
    );
    assert!(
        ok > 0 && refusals > 0,
        "ok {ok}, refusals {refusals}: the limit was never reached"
    );
    if before > 0 {
        assert!(
            after as f64 <= before as f64 * 1.10,
            "RSS {before} -> {after}"
        );
    }
    let m = s.state.engine.metrics();
    assert_eq!(m.requests_running + m.requests_waiting, 0);
    assert_eq!(s.state.engine.in_flight(), 0);
    s.still_serves().await;
}
