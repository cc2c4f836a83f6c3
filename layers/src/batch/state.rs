//! The batches of one stack: the one being formed, and each formed batch's
//! members until its handler has run.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::request::{BatchFailed, Outcomes};
use crate::{BoxError, Delivery, Verdict};

/// How batches are formed and how many run at once: shared by every
/// service of a [`BatchLayer`](super::BatchLayer) (and, for the limit on
/// running batches, by every clone of this handle).
///
/// # Clone
///
/// Clones share the limit on running batches; each
/// [`BatchLayer`](super::BatchLayer) built from one forms its own batches.
#[derive(Clone)]
pub struct Batcher {
    max_size: usize,
    max_wait: Duration,
    running: Arc<Semaphore>,
    /// Deliveries held now: in a batch being formed, or waiting for one
    /// to run, before the claim.
    held: Arc<AtomicUsize>,
}

impl Batcher {
    /// Batches of at most `max_size` deliveries (at least 1), a batch
    /// waiting at most `max_wait` after its first delivery for the rest, and
    /// at most `concurrency` batches running at once (at least 1).
    pub fn new(max_size: usize, max_wait: Duration, concurrency: usize) -> Self {
        Batcher {
            max_size: max_size.max(1),
            max_wait,
            running: Arc::new(Semaphore::new(concurrency.max(1))),
            held: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The largest batch.
    pub fn max_size(&self) -> usize {
        self.max_size
    }

    /// How long a batch waits after its first delivery for the rest.
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// How many batches may start now (of the `concurrency` given).
    pub fn available(&self) -> usize {
        self.running.available_permits()
    }

    /// Deliveries held now, every layer built from this batcher together:
    /// in a batch being formed, or in one waiting to run (not yet claimed).
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    pub(super) fn held_counter(&self) -> &AtomicUsize {
        &self.held
    }

    pub(super) fn running(&self) -> &Arc<Semaphore> {
        &self.running
    }

    pub(super) fn forming(&self) -> Forming {
        Forming {
            batcher: self.clone(),
            current: Arc::new(Mutex::new(None)),
        }
    }
}

impl fmt::Debug for Batcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("max_size", &self.max_size)
            .field("max_wait", &self.max_wait)
            .field("available", &self.available())
            .field("held", &self.held())
            .finish()
    }
}

/// One layer's batch being formed (shared by its services).
#[derive(Clone)]
pub(super) struct Forming {
    pub(super) batcher: Batcher,
    current: Arc<Mutex<Option<Arc<BatchState>>>>,
}

impl Forming {
    /// Adds a member to the batch being formed (opening one if none is),
    /// and closes it if it is full.
    pub(super) fn join(&self) -> Ticket {
        let mut current = lock(&self.current);
        let state = match &*current {
            Some(s) => s.clone(),
            None => {
                let s = Arc::new(BatchState::new(
                    tokio::time::Instant::now() + self.batcher.max_wait,
                ));
                *current = Some(s.clone());
                s
            }
        };
        let index = {
            let mut members = state.members();
            members.slots.push(Member::Waiting);
            members.waiting += 1;
            members.slots.len() - 1
        };
        if index + 1 >= self.batcher.max_size {
            *current = None;
            state.closed.cancel();
        }
        Ticket { state, index }
    }

    /// Closes `state` if it is still the batch being formed (its
    /// `max_wait` has passed).
    pub(super) fn close(&self, state: &Arc<BatchState>) {
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, state)) {
            *current = None;
        }
        state.closed.cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs a formed batch: given its deliveries, yields one outcome each.
pub(super) type Runner = Box<dyn FnOnce(Vec<Delivery>) -> BoxFuture<'static, Outcomes> + Send>;

/// A member's place in its batch, carried in the delivery's extensions
/// from the layer that formed the batch to the handler that runs it.
#[derive(Clone)]
pub(super) struct Ticket {
    pub(super) state: Arc<BatchState>,
    pub(super) index: usize,
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

/// A member of a batch.
enum Member {
    /// Held before the claim, or on its way to the handler.
    Waiting,
    /// At the handler, waiting for the batch to run.
    Arrived(Delivery, oneshot::Sender<Result<Verdict, BoxError>>),
    /// Will not come: handed back, dropped, or decided without the handler
    /// (a redelivery bound); or already given to the running batch.
    Gone,
}

#[derive(Default)]
struct Members {
    slots: Vec<Member>,
    /// How many slots are `Waiting`.
    waiting: usize,
    started: bool,
    /// One of the `concurrency` running batches, from when the batch was
    /// formed until its handler has returned.
    permit: Option<OwnedSemaphorePermit>,
    runner: Option<Runner>,
}

/// One batch: formed until closed, then run once every member has either
/// reached the handler or left.
pub(super) struct BatchState {
    pub(super) deadline: tokio::time::Instant,
    /// Cancelled when the batch is closed (full, or `max_wait` passed).
    pub(super) closed: CancellationToken,
    /// Set once a running-batch permit was taken.
    permitted: tokio::sync::OnceCell<()>,
    members: Mutex<Members>,
}

impl BatchState {
    fn new(deadline: tokio::time::Instant) -> Self {
        BatchState {
            deadline,
            closed: CancellationToken::new(),
            permitted: tokio::sync::OnceCell::new(),
            members: Mutex::new(Members::default()),
        }
    }

    fn members(&self) -> MutexGuard<'_, Members> {
        lock(&self.members)
    }

    /// Waits for one of the running batches' permits (once per batch,
    /// whichever member asks first; another takes over if it is dropped).
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: a permit is kept by the batch once taken.
    pub(super) async fn permit(&self, running: &Arc<Semaphore>) {
        self.permitted
            .get_or_init(|| async {
                // The semaphore is never closed.
                if let Ok(p) = running.clone().acquire_owned().await {
                    self.members().permit = Some(p);
                }
            })
            .await;
    }

    /// Member `index` reached the handler: `None` when the batch has
    /// already run (this is a retry), else the receiver of its outcome.
    pub(super) fn arrive(
        &self,
        index: usize,
        delivery: Delivery,
        runner: impl FnOnce() -> Runner,
    ) -> Result<oneshot::Receiver<Result<Verdict, BoxError>>, Delivery> {
        let mut members = self.members();
        if members.started {
            return Err(delivery);
        }
        let (tx, rx) = oneshot::channel();
        let slot = std::mem::replace(&mut members.slots[index], Member::Arrived(delivery, tx));
        if matches!(slot, Member::Waiting) {
            members.waiting -= 1;
        }
        if members.runner.is_none() {
            members.runner = Some(runner());
        }
        self.start_if_complete(members);
        Ok(rx)
    }

    /// Member `index` is done with its batch: it will not reach the
    /// handler (handed back, or decided without it), or its outcome is
    /// final without the batch (its attempt dropped, then decided
    /// otherwise). It is taken out of a batch that has not run; if it was
    /// the last one the batch waited for, the batch runs now.
    pub(super) fn leave(&self, index: usize) {
        let mut members = self.members();
        if !members.started
            && matches!(
                members.slots.get(index),
                Some(Member::Waiting | Member::Arrived(..))
            )
        {
            let slot = std::mem::replace(&mut members.slots[index], Member::Gone);
            if matches!(slot, Member::Waiting) {
                members.waiting -= 1;
            }
            self.start_if_complete(members);
        }
    }

    /// Runs the batch once it is closed, nothing is on its way, and it has
    /// not run yet; with no member at the handler, just gives its permit
    /// back.
    fn start_if_complete(&self, mut members: MutexGuard<'_, Members>) {
        // A batch still open has no member at the handler yet; the member
        // that closes it is still on its way, and acts after.
        if members.started || !self.closed.is_cancelled() || members.waiting > 0 {
            return;
        }
        members.started = true;
        start(members);
    }
}

/// Takes the batch's members and runs it (see `start_if_complete`).
fn start(mut members: MutexGuard<'_, Members>) {
    let permit = members.permit.take();
    let runner = members.runner.take();
    let (deliveries, senders): (Vec<_>, Vec<_>) = members
        .slots
        .iter_mut()
        .filter_map(|m| match std::mem::replace(m, Member::Gone) {
            Member::Arrived(d, tx) => Some((d, tx)),
            _ => None,
        })
        .unzip();
    drop(members);
    let Some(runner) = runner else {
        drop(permit);
        return;
    };
    if deliveries.is_empty() {
        return;
    }
    // Outside a runtime (a stack dropped after it), the members' senders
    // are dropped: each gets an error, and nothing runs.
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(run_batch(runner(deliveries), senders, permit));
    }
}

/// Calls the handler and gives each member its outcome; stops early when
/// every member stopped waiting (abandoned by the drain).
async fn run_batch(
    run: BoxFuture<'static, Outcomes>,
    mut senders: Vec<oneshot::Sender<Result<Verdict, BoxError>>>,
    permit: Option<OwnedSemaphorePermit>,
) {
    let outcomes = {
        let abandoned = futures::future::join_all(senders.iter_mut().map(|s| s.closed()));
        match futures::future::select(run, std::pin::pin!(abandoned)).await {
            futures::future::Either::Left((outcomes, _)) => Some(outcomes),
            futures::future::Either::Right(_) => None,
        }
    };
    drop(permit);
    let Some(outcomes) = outcomes else { return };
    let len = senders.len();
    let outcomes = if outcomes.len() == len {
        outcomes
    } else {
        BatchFailed::new(
            format!(
                "the batch handler returned {} outcomes for {len} deliveries",
                outcomes.len()
            )
            .into(),
        )
        .for_each(len)
    };
    for (tx, outcome) in senders.into_iter().zip(outcomes) {
        let _ = tx.send(outcome);
    }
}
