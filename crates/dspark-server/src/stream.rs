//! Server-sent events: `data: {chunk}` events, a usage chunk when asked for, then
//! `data: [DONE]`; a failure midway is sent as `data: {"error": ...}` before `[DONE]`.
//! Keep-alive comments every few seconds also reveal a client that left while its request
//! waits. When the client disconnects, hyper drops the stream and with it every choice's
//! [`Session`], whose guard aborts its request in the engine.
//!
//! A request with `n` choices streams them interleaved as their tokens come, each chunk naming
//! its choice's `index`; the usage chunk (after every choice finished) counts the prompt once
//! and the completions of all choices.

use std::convert::Infallible;
use std::pin::Pin;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, SelectAll, Stream, StreamExt};

use crate::api::ApiError;
use crate::api::response::Usage;
use crate::session::{Delta, Finish, Out, Session};

/// Keep-alive comment interval.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// How an endpoint writes its chunks (JSON text of each `data:` event) for choice `index`.
pub trait Chunks: Send + 'static {
    /// A chunk before any text (chat: the assistant role), if the endpoint has one.
    fn opening(&self, index: usize) -> Option<String>;
    /// New text (and log-probabilities).
    fn text(&self, index: usize, out: Out) -> String;
    /// The last piece, with the finish reason and dspark's figures.
    fn finish(&self, index: usize, out: Out, finish: &Finish) -> String;
    /// The usage chunk (empty `choices`).
    fn usage(&self, usage: Usage) -> String;
}

/// The usage of a request whose choices ended with `finishes`: the prompt once, the
/// completions summed.
pub fn total_usage<'a>(finishes: impl IntoIterator<Item = &'a Finish>) -> Usage {
    let mut prompt = 0;
    let mut completion = 0;
    for f in finishes {
        prompt = f.usage.prompt_tokens;
        completion += f.usage.completion_tokens;
    }
    Usage::new(prompt, completion)
}

type Choice = Pin<Box<dyn Stream<Item = (usize, Result<Delta, ApiError>)> + Send>>;

/// Choice `index`'s deltas, ending after its [`Delta::Done`] or its error.
fn choice(index: usize, session: Session) -> Choice {
    stream::unfold(Some(session), move |s| async move {
        let mut s = s?;
        match s.next().await {
            Ok(Some(d)) => {
                let done = matches!(d, Delta::Done(..));
                Some(((index, Ok(d)), (!done).then_some(s)))
            }
            Ok(None) => None,
            Err(e) => Some(((index, Err(e)), None)),
        }
    })
    .boxed()
}

enum Phase {
    Opening(usize),
    Body,
    Usage,
    Done,
    End,
}

struct State<C> {
    choices: SelectAll<Choice>,
    chunks: C,
    phase: Phase,
    n: usize,
    open: usize,
    finishes: Vec<Finish>,
    include_usage: bool,
}

fn data(json: String) -> Result<Event, Infallible> {
    Ok(Event::default().data(json))
}

/// The streamed answer of `sessions` (choice `i` is `sessions[i]`).
pub fn sse<C: Chunks>(sessions: Vec<Session>, chunks: C, include_usage: bool) -> Response {
    let n = sessions.len();
    let state = State {
        choices: stream::select_all(sessions.into_iter().enumerate().map(|(i, s)| choice(i, s))),
        chunks,
        phase: Phase::Opening(0),
        n,
        open: n,
        finishes: Vec::with_capacity(n),
        include_usage,
    };
    let events = stream::unfold(state, |mut st| async move {
        loop {
            match std::mem::replace(&mut st.phase, Phase::End) {
                Phase::Opening(i) if i < st.n => {
                    st.phase = Phase::Opening(i + 1);
                    if let Some(chunk) = st.chunks.opening(i) {
                        return Some((data(chunk), st));
                    }
                }
                Phase::Opening(_) => st.phase = Phase::Body,
                Phase::Body => match st.choices.next().await {
                    Some((i, Ok(Delta::Text(out)))) => {
                        st.phase = Phase::Body;
                        return Some((data(st.chunks.text(i, out)), st));
                    }
                    Some((i, Ok(Delta::Done(out, finish)))) => {
                        st.open = st.open.saturating_sub(1);
                        st.phase = match (st.open, st.include_usage) {
                            (0, true) => Phase::Usage,
                            (0, false) => Phase::Done,
                            _ => Phase::Body,
                        };
                        let chunk = st.chunks.finish(i, out, &finish);
                        st.finishes.push(finish);
                        return Some((data(chunk), st));
                    }
                    Some((_, Err(e))) => {
                        st.phase = Phase::Done;
                        return Some((data(e.body_json()), st));
                    }
                    None => st.phase = Phase::Done,
                },
                Phase::Usage => {
                    st.phase = Phase::Done;
                    let usage = total_usage(&st.finishes);
                    return Some((data(st.chunks.usage(usage)), st));
                }
                Phase::Done => {
                    // Whatever still runs (after an error) is aborted now.
                    st.choices = SelectAll::new();
                    return Some((data("[DONE]".into()), st));
                }
                Phase::End => return None,
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}
