//! What the connection's tasks and its handles share: the requests
//! waiting for an answer, the outgoing frames, and why it ended.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::stream::error::StreamError;
use crate::stream::types::StreamEvent;
use crate::stream::wire::Reader;
use crate::sync::Locked;

/// A response's code and what follows it.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) code: u16,
    pub(crate) body: Reader,
}

/// The shared state of one connection.
#[derive(Debug)]
pub(crate) struct State {
    next: AtomicU32,
    pending: Mutex<HashMap<u32, oneshot::Sender<Response>>>,
    /// Why the connection ended, once it has.
    ended: Mutex<Option<StreamError>>,
    out: mpsc::UnboundedSender<Bytes>,
    /// Where events go, until the connection ends (its last event is
    /// `Closed`: nothing is sent after it).
    events: Mutex<Option<mpsc::UnboundedSender<StreamEvent>>>,
    /// The application is closing: the socket's end that follows is the
    /// close, not a loss.
    closing: AtomicBool,
}

impl State {
    pub(crate) fn new(
        out: mpsc::UnboundedSender<Bytes>,
        events: mpsc::UnboundedSender<StreamEvent>,
        first_corr: u32,
    ) -> Self {
        State {
            next: AtomicU32::new(first_corr),
            pending: Mutex::new(HashMap::new()),
            ended: Mutex::new(None),
            out,
            events: Mutex::new(Some(events)),
            closing: AtomicBool::new(false),
        }
    }

    /// Why the connection ended, if it has.
    pub(crate) fn ended(&self) -> Option<StreamError> {
        self.ended.locked().clone()
    }

    /// Queues a frame for the writer.
    pub(crate) fn send(&self, frame: Bytes) -> Result<(), StreamError> {
        if let Some(e) = self.ended() {
            return Err(e);
        }
        self.out.send(frame).map_err(|_| StreamError::Closed)
    }

    /// Hands an event to the application (nothing after the connection
    /// ended; a receiver dropped is an application not listening).
    pub(crate) fn emit(&self, event: StreamEvent) {
        if let Some(tx) = self.events.locked().as_ref() {
            let _ = tx.send(event);
        }
    }

    /// Marks the connection as being closed by the application.
    pub(crate) fn closing(&self) {
        self.closing.store(true, Ordering::Relaxed);
    }

    /// A new correlation id and the receiver of its response.
    pub(crate) fn register(&self) -> (u32, oneshot::Receiver<Response>) {
        let corr = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.locked().insert(corr, tx);
        (corr, rx)
    }

    /// Forgets a request (it timed out).
    pub(crate) fn forget(&self, corr: u32) {
        self.pending.locked().remove(&corr);
    }

    /// Hands a response to its request; false when none waits for it.
    pub(crate) fn answer(&self, corr: u32, response: Response) -> bool {
        match self.pending.locked().remove(&corr) {
            Some(tx) => tx.send(response).is_ok(),
            None => false,
        }
    }

    /// Records why the connection ended (the first reason wins), fails
    /// every waiting request, tells the writer to stop once what is queued
    /// is written (an empty frame), and sends the last event, `Closed`
    /// (once); the reason kept.
    pub(crate) fn end(&self, why: StreamError) -> StreamError {
        let why = if self.closing.load(Ordering::Relaxed) {
            StreamError::Closed
        } else {
            why
        };
        let kept = {
            let mut ended = self.ended.locked();
            ended.get_or_insert(why).clone()
        };
        self.pending.locked().clear();
        let _ = self.out.send(Bytes::new());
        if let Some(tx) = self.events.locked().take() {
            let _ = tx.send(StreamEvent::Closed(kept.clone()));
        }
        kept
    }
}
