//! The engine on its own OS thread, behind channels.
//!
//! - **In:** one bounded channel of [`Command`]s (add, abort, wake). Admission is bounded
//!   before it: a request takes one of `limit` slots (a semaphore permit) or is refused at
//!   once with 429; the permit travels with the `Add` and is released by the engine thread
//!   when the request ends, so the channel (sized `2 * limit + 16`) holds at most one add and
//!   one abort per slot. Senders only ever `try_send`: HTTP tasks never block on the engine.
//! - **Out:** one unbounded channel of [`Event`]s per request. Sending never blocks the engine
//!   thread; what a channel can hold is bounded by the request's `max_tokens`.
//! - **The loop:** drain every pending command, run one `step()` when there is work, hand each
//!   request its new tokens, publish the metrics; with no work, block until a command comes.
//! - **Cancellation:** the HTTP side holds an [`AbortGuard`]; dropping it armed (the client
//!   went away and the response stream was dropped) sends `Abort`. Independently, before
//!   each step the thread aborts every request whose receiver is gone (as TGI checks
//!   `is_closed()`), so a lost abort costs at most one step.
//! - **Shutdown:** [`EngineHandle::shutdown`] stops admission; the thread keeps stepping until
//!   its requests finish or the deadline passes, then aborts the rest (each gets a `Finished`
//!   with reason `Aborted`) and exits.
//! - **Failures:** a step error fails every request in flight (500) and aborts them; a panic
//!   does the same and stops the thread (`/health` then answers 503).

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use dspark::engine::{EngineMetrics, FinishReason, RequestId, RequestSpec, RequestUsage};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::ApiError;
use crate::engine::ServingEngine;
use crate::error::StartError;
use crate::metrics::{AbortCause, ServerMetrics};

/// What the engine thread tells one request.
#[derive(Debug)]
pub enum Event {
    /// The engine took the request (always the first event, unless `Rejected`).
    Admitted,
    /// The engine refused the request (bad values, can never fit, shutting down).
    Rejected(ApiError),
    /// Tokens committed in one step, the request's usage so far, and when.
    Tokens {
        /// The new token ids.
        ids: Vec<u32>,
        /// Their log-probabilities, when the request asked for them (else empty).
        logprobs: Vec<dspark::sampling::TokenLogprob>,
        /// Usage so far.
        usage: RequestUsage,
        /// When the step produced them.
        at: Instant,
    },
    /// The request ended (`Aborted`: by shutdown, or after an abort it no longer hears of).
    Finished {
        /// Why.
        reason: FinishReason,
        /// Its final usage.
        usage: RequestUsage,
        /// When.
        at: Instant,
    },
    /// The engine failed while running the request.
    Failed(ApiError),
}

/// A request's handle inside the server (not the engine's id, which the thread maps to).
pub type Ticket = u64;

/// What the engine thread is asked.
enum Command {
    Add {
        ticket: Ticket,
        spec: RequestSpec,
        events: UnboundedSender<Event>,
        permit: OwnedSemaphorePermit,
    },
    Abort {
        ticket: Ticket,
    },
    /// Look at the shutdown deadline (sent by [`EngineHandle::shutdown`]).
    Wake,
}

/// State shared by the handle and the thread.
struct Shared {
    metrics: Mutex<EngineMetrics>,
    alive: AtomicBool,
    accepting: AtomicBool,
    deadline: Mutex<Option<Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One of the engine's slots, taken before a request is tokenized ([`EngineHandle::reserve`]).
pub struct Reservation(OwnedSemaphorePermit);

/// The server's side of the engine thread.
pub struct EngineHandle {
    commands: SyncSender<Command>,
    slots: Arc<Semaphore>,
    limit: usize,
    shared: Arc<Shared>,
    next_ticket: AtomicU64,
    server_metrics: Arc<ServerMetrics>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// A submitted request: its events, and the guard that aborts it when dropped.
pub struct Submitted {
    /// The engine's events for this request.
    pub events: UnboundedReceiver<Event>,
    /// Aborts the request when dropped before it finished.
    pub guard: AbortGuard,
}

/// Sends `Abort` for its request when dropped armed.
pub struct AbortGuard {
    ticket: Ticket,
    commands: SyncSender<Command>,
    metrics: Arc<ServerMetrics>,
    armed: bool,
}

impl AbortGuard {
    /// The request finished in the engine: nothing to abort.
    pub fn disarm(&mut self) {
        self.armed = false;
    }

    /// Abort the request now, for `cause` (counted in `request_aborts_total`).
    pub fn abort(&mut self, cause: AbortCause) {
        if self.armed {
            self.metrics.count_abort(cause);
        }
        self.release();
    }

    /// End the request in the engine now because it is complete on the server's side (a stop
    /// string matched): its row is freed, and it counts as a finish, not an abort.
    pub fn release(&mut self) {
        if std::mem::take(&mut self.armed) {
            match self.commands.try_send(Command::Abort {
                ticket: self.ticket,
            }) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => {}
                // The receiver is dropped right after: the thread's closed-channel check
                // aborts the request before its next step.
                Err(TrySendError::Full(_)) => {
                    tracing::debug!(ticket = self.ticket, "abort deferred: command channel full")
                }
            }
        }
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        self.abort(AbortCause::ClientDisconnect);
    }
}

impl EngineHandle {
    /// Start the engine thread: `make` builds the engine on it (loading models there); returns
    /// once it is built, or `make`'s error. `limit`: requests in flight (running and queued)
    /// at most.
    pub fn spawn<E, F>(
        make: F,
        limit: usize,
        server_metrics: Arc<ServerMetrics>,
    ) -> Result<Self, StartError>
    where
        E: ServingEngine,
        F: FnOnce() -> Result<E, StartError> + Send + 'static,
    {
        let limit = limit.max(1);
        let (commands, rx) = sync_channel(2 * limit + 16);
        let shared = Arc::new(Shared {
            metrics: Mutex::new(EngineMetrics::default()),
            alive: AtomicBool::new(true),
            accepting: AtomicBool::new(true),
            deadline: Mutex::new(None),
        });
        let (ready_tx, ready_rx) = sync_channel::<Result<(), StartError>>(1);
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("dspark-engine".into())
            .spawn(move || {
                let engine = match catch_unwind(AssertUnwindSafe(make)) {
                    Ok(Ok(engine)) => engine,
                    Ok(Err(e)) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                    Err(panic) => {
                        let e = dspark::error::panic_message(panic.as_ref());
                        let e = StartError::new(
                            "internal",
                            format!("building the engine panicked: {e}"),
                        );
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                *lock(&thread_shared.metrics) = engine.metrics();
                let _ = ready_tx.send(Ok(()));
                Loop::new(engine, rx, Arc::clone(&thread_shared)).run();
                thread_shared.alive.store(false, Ordering::SeqCst);
            })
            .map_err(|e| StartError::new("io", format!("cannot start the engine thread: {e}")))?;
        let ready = ready_rx.recv().unwrap_or_else(|_| {
            Err(StartError::new(
                "internal",
                "the engine thread exited while starting",
            ))
        });
        if let Err(e) = ready {
            let _ = thread.join();
            return Err(e);
        }
        Ok(Self {
            commands,
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            shared,
            next_ticket: AtomicU64::new(0),
            server_metrics,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Take one of the `limit` slots without waiting, for a request about to be tokenized and
    /// submitted: 429 when every slot is taken, 503 while shutting down or when the engine
    /// has stopped. The slot is released when the request ends (or the reservation drops).
    pub fn reserve(&self) -> Result<Reservation, ApiError> {
        if !self.shared.accepting.load(Ordering::SeqCst) {
            self.server_metrics.count_rejected(false);
            return Err(ApiError::unavailable(
                "shutting_down",
                "the server is shutting down",
            ));
        }
        if !self.is_alive() {
            self.server_metrics.count_rejected(false);
            return Err(ApiError::unavailable(
                "engine_stopped",
                "the engine has stopped",
            ));
        }
        let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() else {
            self.server_metrics.count_rejected(true);
            return Err(ApiError::queue_full(self.limit));
        };
        Ok(Reservation(permit))
    }

    /// Hand a request to the engine on its reserved slot, without waiting (503 when the
    /// engine has stopped or the channel is closed).
    pub fn submit(&self, slot: Reservation, spec: RequestSpec) -> Result<Submitted, ApiError> {
        let permit = slot.0;
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let (events_tx, events) = unbounded_channel();
        let add = Command::Add {
            ticket,
            spec,
            events: events_tx,
            permit,
        };
        match self.commands.try_send(add) {
            Ok(()) => Ok(Submitted {
                events,
                guard: AbortGuard {
                    ticket,
                    commands: self.commands.clone(),
                    metrics: Arc::clone(&self.server_metrics),
                    armed: true,
                },
            }),
            Err(TrySendError::Full(_)) => {
                self.server_metrics.count_rejected(true);
                Err(ApiError::queue_full(self.limit))
            }
            Err(TrySendError::Disconnected(_)) => {
                self.server_metrics.count_rejected(false);
                Err(ApiError::unavailable(
                    "engine_stopped",
                    "the engine has stopped",
                ))
            }
        }
    }

    /// The engine's counters as of its last step.
    pub fn metrics(&self) -> EngineMetrics {
        lock(&self.shared.metrics).clone()
    }

    /// Requests holding a slot (running, queued, or finished but not yet released).
    pub fn in_flight(&self) -> usize {
        self.limit - self.slots.available_permits()
    }

    /// Slots in all.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether the engine thread is running.
    pub fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    /// Whether new requests are admitted.
    pub fn is_accepting(&self) -> bool {
        self.shared.accepting.load(Ordering::SeqCst)
    }

    /// Stop admitting; requests in flight finish until `deadline`, then are aborted.
    pub fn shutdown(&self, deadline: Instant) {
        self.shared.accepting.store(false, Ordering::SeqCst);
        *lock(&self.shared.deadline) = Some(deadline);
        let _ = self.commands.try_send(Command::Wake);
    }

    /// Wait up to `timeout` for the engine thread to exit; `true` if it did.
    pub fn join(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut slot = lock(&self.thread);
        let Some(thread) = slot.take() else {
            return true;
        };
        while !thread.is_finished() {
            if Instant::now() >= end {
                *slot = Some(thread);
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = thread.join();
        true
    }
}

/// A request on the engine thread.
struct Live {
    ticket: Ticket,
    events: UnboundedSender<Event>,
    _permit: OwnedSemaphorePermit,
}

/// The engine thread's state.
struct Loop<E> {
    engine: E,
    rx: Receiver<Command>,
    shared: Arc<Shared>,
    live: HashMap<RequestId, Live>,
    tickets: HashMap<Ticket, RequestId>,
    disconnected: bool,
}

impl<E: ServingEngine> Loop<E> {
    fn new(engine: E, rx: Receiver<Command>, shared: Arc<Shared>) -> Self {
        Self {
            engine,
            rx,
            shared,
            live: HashMap::new(),
            tickets: HashMap::new(),
            disconnected: false,
        }
    }

    fn run(mut self) {
        loop {
            let deadline = *lock(&self.shared.deadline);
            if !self.engine.has_work() {
                if deadline.is_some() || self.disconnected {
                    break;
                }
                // Idle: block until something arrives.
                match self.rx.recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => break,
                }
            }
            self.drain();
            self.drop_closed();
            if deadline.is_some_and(|d| Instant::now() >= d) {
                self.abort_all();
                break;
            }
            if self.engine.has_work() && !self.step() {
                break;
            }
            self.publish();
        }
        self.abort_all();
        self.publish();
    }

    fn drain(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(cmd) => self.handle(cmd),
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.disconnected = true;
                    return;
                }
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Add {
                ticket,
                spec,
                events,
                permit,
            } => {
                if lock(&self.shared.deadline).is_some() {
                    let e = ApiError::unavailable("shutting_down", "the server is shutting down");
                    let _ = events.send(Event::Rejected(e));
                    return;
                }
                match self.engine.add_request(spec) {
                    Ok(id) => {
                        let _ = events.send(Event::Admitted);
                        self.tickets.insert(ticket, id);
                        self.live.insert(
                            id,
                            Live {
                                ticket,
                                events,
                                _permit: permit,
                            },
                        );
                    }
                    Err(e) => {
                        let _ = events.send(Event::Rejected(ApiError::from_engine(&e)));
                    }
                }
            }
            Command::Abort { ticket } => {
                if let Some(id) = self.tickets.remove(&ticket) {
                    self.live.remove(&id);
                    if let Err(e) = self.engine.abort(id) {
                        tracing::debug!("abort of {id}: {e}");
                    }
                }
            }
            Command::Wake => {}
        }
    }

    fn forget(&mut self, id: RequestId) -> Option<Live> {
        let live = self.live.remove(&id)?;
        self.tickets.remove(&live.ticket);
        Some(live)
    }

    /// Abort every request nobody listens to any more.
    fn drop_closed(&mut self) {
        let closed: Vec<RequestId> = self
            .live
            .iter()
            .filter(|(_, l)| l.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in closed {
            self.forget(id);
            let _ = self.engine.abort(id);
        }
    }

    /// One step; `false` when the engine panicked (the thread then stops).
    fn step(&mut self) -> bool {
        match catch_unwind(AssertUnwindSafe(|| self.engine.step())) {
            Ok(Ok(out)) => {
                // Counters first: a client that has its last token sees them in /metrics.
                self.publish();
                let at = Instant::now();
                for o in out.outputs {
                    let Some(live) = self.live.get(&o.id) else {
                        continue;
                    };
                    let mut sent = true;
                    if !o.new_tokens.is_empty() {
                        sent = live
                            .events
                            .send(Event::Tokens {
                                ids: o.new_tokens,
                                logprobs: o.logprobs,
                                usage: o.usage,
                                at,
                            })
                            .is_ok();
                    }
                    if let Some(e) = &o.error {
                        // Its own rows failed: this request alone gets the error (500); the
                        // others run on unchanged.
                        let _ = live.events.send(Event::Failed(ApiError::internal(format!(
                            "the request failed: {} ({})",
                            e.message, e.code
                        ))));
                        self.forget(o.id);
                    } else if let Some(reason) = o.finish {
                        let _ = live.events.send(Event::Finished {
                            reason,
                            usage: o.usage,
                            at,
                        });
                        self.forget(o.id);
                    } else if !sent {
                        self.forget(o.id);
                        let _ = self.engine.abort(o.id);
                    }
                }
                true
            }
            Ok(Err(e)) => {
                tracing::error!("engine step failed: {e}");
                self.fail_all(&ApiError::internal(format!(
                    "engine step failed: {e} ({})",
                    e.code()
                )));
                true
            }
            Err(panic) => {
                let message = dspark::error::panic_message(panic.as_ref());
                tracing::error!("engine step panicked: {message}");
                self.fail_all(&ApiError::internal(format!(
                    "the engine panicked: {message}"
                )));
                false
            }
        }
    }

    fn fail_all(&mut self, error: &ApiError) {
        let ids: Vec<RequestId> = self.live.keys().copied().collect();
        for id in ids {
            if let Some(live) = self.forget(id) {
                let _ = live.events.send(Event::Failed(error.clone()));
            }
            let _ = self.engine.abort(id);
        }
    }

    /// Abort everything still running (shutdown): each request hears `Finished(Aborted)`.
    fn abort_all(&mut self) {
        let at = Instant::now();
        let ids: Vec<RequestId> = self.live.keys().copied().collect();
        for id in ids {
            if let Some(live) = self.forget(id) {
                let _ = live.events.send(Event::Finished {
                    reason: FinishReason::Aborted,
                    usage: RequestUsage::default(),
                    at,
                });
            }
            let _ = self.engine.abort(id);
        }
    }

    fn publish(&self) {
        *lock(&self.shared.metrics) = self.engine.metrics();
    }
}
