//! Server-sent events: `data: {chunk}` events, a usage chunk when asked for, then
//! `data: [DONE]`; a failure midway is sent as `data: {"error": ...}` before `[DONE]`.
//! Keep-alive comments every few seconds also reveal a client that left while its request
//! waits. When the client disconnects, hyper drops the stream and with it the
//! [`Session`], whose guard aborts the request in the engine.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;

use crate::api::response::Usage;
use crate::session::{Delta, Finish, Out, Session};

/// Keep-alive comment interval.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// How an endpoint writes its chunks (JSON text of each `data:` event).
pub trait Chunks: Send + 'static {
    /// A chunk before any text (chat: the assistant role), if the endpoint has one.
    fn opening(&self) -> Option<String>;
    /// New text (and log-probabilities).
    fn text(&self, out: Out) -> String;
    /// The last piece, with the finish reason and dspark's figures.
    fn finish(&self, out: Out, finish: &Finish) -> String;
    /// The usage chunk (empty `choices`).
    fn usage(&self, usage: Usage) -> String;
}

enum Phase {
    Opening,
    Body,
    Usage(Usage),
    Done,
    End,
}

struct State<C> {
    session: Session,
    chunks: C,
    phase: Phase,
    include_usage: bool,
}

fn data(json: String) -> Result<Event, Infallible> {
    Ok(Event::default().data(json))
}

/// The streamed answer of `session`.
pub fn sse<C: Chunks>(session: Session, chunks: C, include_usage: bool) -> Response {
    let state = State {
        session,
        chunks,
        phase: Phase::Opening,
        include_usage,
    };
    let events = stream::unfold(state, |mut st| async move {
        loop {
            match std::mem::replace(&mut st.phase, Phase::End) {
                Phase::Opening => {
                    st.phase = Phase::Body;
                    if let Some(chunk) = st.chunks.opening() {
                        return Some((data(chunk), st));
                    }
                }
                Phase::Body => match st.session.next().await {
                    Ok(Some(Delta::Text(text))) => {
                        st.phase = Phase::Body;
                        return Some((data(st.chunks.text(text)), st));
                    }
                    Ok(Some(Delta::Done(text, finish))) => {
                        st.phase = if st.include_usage {
                            Phase::Usage(finish.usage)
                        } else {
                            Phase::Done
                        };
                        return Some((data(st.chunks.finish(text, &finish)), st));
                    }
                    Ok(None) => st.phase = Phase::Done,
                    Err(e) => {
                        st.phase = Phase::Done;
                        return Some((data(e.body_json()), st));
                    }
                },
                Phase::Usage(usage) => {
                    st.phase = Phase::Done;
                    return Some((data(st.chunks.usage(usage)), st));
                }
                Phase::Done => return Some((data("[DONE]".into()), st)),
                Phase::End => return None,
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}
