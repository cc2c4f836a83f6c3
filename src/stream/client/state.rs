//! What the connection's tasks and its handles share: the requests
//! waiting for an answer, the outgoing frames, and why it ended.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::stream::error::StreamError;
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
}

impl State {
    pub(crate) fn new(out: mpsc::UnboundedSender<Bytes>, first_corr: u32) -> Self {
        State {
            next: AtomicU32::new(first_corr),
            pending: Mutex::new(HashMap::new()),
            ended: Mutex::new(None),
            out,
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

    /// Records why the connection ended (the first reason wins) and fails
    /// every waiting request; the reason kept.
    pub(crate) fn end(&self, why: StreamError) -> StreamError {
        let kept = {
            let mut ended = self.ended.locked();
            ended.get_or_insert(why).clone()
        };
        self.pending.locked().clear();
        kept
    }
}
