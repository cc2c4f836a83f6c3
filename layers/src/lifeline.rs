//! What a handler may know about its delivery's fate without being able to
//! change it: a [`Cancellation`] it can wait on (but not trigger), and a
//! [`Lifeline`] that says whether the channel the delivery came on is gone.

use std::fmt;
use std::sync::Arc;

use futures::future::{self, Either};

use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::{
    shared_static, CancellationToken, Notify, OwnedNotified, WaitForCancellationFuture,
    WaitForCancellationFutureOwned,
};

/// A read-only view of a cancellation token: a handler can wait on it and
/// ask whether it fired, but not cancel it (only the drain, at its deadline,
/// and the transport, when the delivery's channel is lost, do).
///
/// Cloning it is one atomic increment: no lock, no allocation.
///
/// A handler cannot cancel it — so it cannot get its own delivery abandoned
/// and left unsettled on a live channel:
///
/// ```compile_fail
/// # use acemq_layers::Delivery;
/// let d = Delivery::builder().build();
/// d.token().cancel(); // no such method: the view only waits
/// ```
///
/// ```
/// # use acemq_layers::Delivery;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let d = Delivery::builder().build();
/// // Stop your own sub-tasks with a child of your own.
/// let mine = d.token().child_token();
/// mine.cancel();
/// assert!(!d.token().is_cancelled());
/// # }
/// ```
#[derive(Clone)]
pub struct Cancellation {
    shared: Arc<Shared>,
}

/// What every view of one token shares.
///
/// Waiting on a tokio-util token costs a lock to clone it, one to ask
/// whether it fired, one to register and one to deregister the waiter, one
/// to drop the clone. The cancellation layer waits on every handler that
/// returns `Pending`, so it waits on `waiters` instead: one `Notify` lock to
/// register and one to deregister. A watcher task, spawned once per token
/// by the first such wait, turns the token's cancellation into `fired` and
/// a wake-up of every waiter (see [`Cancellation::waiter`]).
struct Shared {
    token: CancellationToken,
    flags: Arc<Flags>,
    waiters: Arc<Notify>,
    // Tells the watcher that every view is gone (its permit is kept if the
    // watcher is not waiting yet).
    gone: Arc<Notify>,
}

struct Flags {
    // Set by the watcher once the token is cancelled, before it wakes the
    // waiters.
    fired: AtomicBool,
    // Whether a watcher is running (cleared if its runtime drops it before
    // the token fired, so the next wait spawns another).
    watching: AtomicBool,
}

/// Clears `watching` when a watcher ends without having fired (its runtime
/// shut down).
struct Watching(Arc<Flags>);

impl Drop for Watching {
    fn drop(&mut self) {
        if !self.0.fired.load(Ordering::Acquire) {
            self.0.watching.store(false, Ordering::Release);
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.gone.notify_one();
    }
}

impl Cancellation {
    /// A view of `token`.
    pub fn new(token: CancellationToken) -> Self {
        Cancellation {
            shared: Arc::new(Shared {
                token,
                flags: Arc::new(Flags {
                    fired: AtomicBool::new(false),
                    watching: AtomicBool::new(false),
                }),
                waiters: Arc::new(Notify::new()),
                gone: Arc::new(Notify::new()),
            }),
        }
    }

    /// One that never fires (shared: cloning it allocates nothing).
    pub fn never() -> Self {
        Cancellation::never_ref().clone()
    }

    /// The one that never fires, borrowed (no reference count touched).
    pub(crate) fn never_ref() -> &'static Cancellation {
        shared_static!(Cancellation, Cancellation::new(CancellationToken::new()))
    }

    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        self.shared.token.is_cancelled()
    }

    /// Resolves when cancellation is requested.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: dropping the future loses nothing.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.shared.token.cancelled()
    }

    /// As [`cancelled`](Self::cancelled), owning what it needs (a `'static`
    /// future to move into a task).
    pub fn cancelled_owned(&self) -> WaitForCancellationFutureOwned {
        self.shared.token.clone().cancelled_owned()
    }

    /// A token of your own that is cancelled when this one is: cancel it to
    /// stop your own sub-tasks; that reaches nothing else.
    pub fn child_token(&self) -> CancellationToken {
        self.shared.token.child_token()
    }

    /// A cheap wait for the cancellation, for the cancellation layer: a
    /// future that completes once [`fired`](Self::fired) is true (poll it
    /// only while `fired` is false: it is created before that check, so a
    /// cancellation in between is not missed). `None` outside a tokio
    /// runtime, where the watcher cannot be spawned: wait with
    /// [`cancelled_owned`](Self::cancelled_owned) there.
    pub(crate) fn waiter(&self) -> Option<OwnedNotified> {
        let shared = &*self.shared;
        if !shared.flags.watching.load(Ordering::Acquire) {
            let runtime = crate::sync::runtime()?;
            if shared
                .flags
                .watching
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                let token = shared.token.clone();
                let watching = Watching(shared.flags.clone());
                let waiters = shared.waiters.clone();
                let gone = shared.gone.clone();
                runtime.spawn(async move {
                    let cancelled = std::pin::pin!(token.cancelled());
                    let gone = std::pin::pin!(gone.notified());
                    if let Either::Left(_) = future::select(cancelled, gone).await {
                        watching.0.fired.store(true, Ordering::Release);
                        waiters.notify_waiters();
                    }
                });
            }
        }
        Some(shared.waiters.clone().notified_owned())
    }

    /// Whether the watcher saw the cancellation (see
    /// [`waiter`](Self::waiter)); one atomic load.
    pub(crate) fn fired(&self) -> bool {
        self.shared.flags.fired.load(Ordering::Acquire)
    }

    /// Whether `self` and `other` are views of one token made by one
    /// [`new`](Self::new) (clones of each other): a pointer comparison.
    pub(crate) fn same_as(&self, other: &Cancellation) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl From<CancellationToken> for Cancellation {
    fn from(token: CancellationToken) -> Self {
        Cancellation::new(token)
    }
}

impl Default for Cancellation {
    fn default() -> Self {
        Cancellation::never()
    }
}

impl fmt::Debug for Cancellation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancellation")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

/// Whether the channel a delivery came on is still there.
///
/// A transport gives every delivery of one *generation* (a queue's
/// connection and channel) the same lifeline and calls [`Lifeline::lose`]
/// the moment it knows that channel is gone. From then on the broker has
/// taken the delivery back and will redeliver it: whatever its handler
/// decides is an orphan. The retry and dead-letter layers then publish
/// nothing and wait no more ([`Delivery::is_orphaned`](crate::Delivery::is_orphaned)).
///
/// A lifeline can also carry its generation's [`Cancellation`]
/// ([`with_cancellation`](Self::with_cancellation)): the handlers' token,
/// which fires on a loss or at the drain's deadline. A delivery whose
/// cancellation layer was given that same view
/// ([`CancelLayer::from_cancellation`](crate::CancelLayer::from_cancellation))
/// then finds its token through the lifeline it already shares, and the
/// layer touches no reference count to hand it over (acemq's consumer loop
/// runs it so).
#[derive(Clone)]
pub struct Lifeline {
    inner: Arc<LifelineInner>,
}

struct LifelineInner {
    lost: CancellationToken,
    cancellation: Option<Cancellation>,
    // Set when the transport hands back every delivery of the generation
    // that is still held (not claimed): see [`Lifeline::hand_back_held`].
    // std's atomic in every build: one flag, set once, read with the claim
    // (the race is decided by the delivery's `ClaimCell` alone), and a
    // lifeline may be a process-wide static, which a model-checked atomic
    // cannot be.
    hand_back_held: std::sync::atomic::AtomicBool,
}

impl Lifeline {
    /// A live lifeline for a new generation.
    pub fn new() -> Self {
        Lifeline {
            inner: Arc::new(LifelineInner {
                lost: CancellationToken::new(),
                cancellation: None,
                hand_back_held: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// A live lifeline for a new generation whose handlers' token is
    /// `cancellation` (see the type's docs).
    pub fn with_cancellation(cancellation: Cancellation) -> Self {
        Lifeline {
            inner: Arc::new(LifelineInner {
                lost: CancellationToken::new(),
                cancellation: Some(cancellation),
                hand_back_held: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// The generation's handlers' token, if the lifeline was made
    /// [`with_cancellation`](Self::with_cancellation).
    pub fn cancellation(&self) -> Option<&Cancellation> {
        self.inner.cancellation.as_ref()
    }

    /// One that is never lost (shared: cloning it allocates nothing); what
    /// a delivery built without a transport has.
    pub fn never() -> Self {
        shared_static!(Lifeline, Lifeline::new()).clone()
    }

    /// The channel is gone: every delivery of this generation is orphaned.
    pub fn lose(&self) {
        self.inner.lost.cancel();
    }

    /// Whether [`lose`](Self::lose) was called.
    pub fn is_lost(&self) -> bool {
        self.inner.lost.is_cancelled()
    }

    /// From now on, every delivery of this generation that is still *held*
    /// (not yet [claimed](crate::ClaimLayer) by the innermost part of the
    /// stack) is handed back: a claim that comes later is refused, and the
    /// transport, seeing [`Delivery::hand_back_if_held`](crate::Delivery::hand_back_if_held)
    /// win, returns the delivery to the broker without waiting for it.
    /// Final. A transport calls it when its drain hands back what it holds,
    /// at the drain's deadline, and when the channel is lost.
    ///
    /// Meant for a transport's own lifeline: on [`Lifeline::never`] (shared
    /// by every delivery built without one) it would refuse every later
    /// claim in the process.
    pub fn hand_back_held(&self) {
        self.inner.hand_back_held.store(true, Ordering::Release);
    }

    /// Whether [`hand_back_held`](Self::hand_back_held) was called (one
    /// atomic load).
    pub fn hands_back_held(&self) -> bool {
        self.inner.hand_back_held.load(Ordering::Acquire)
    }

    /// Resolves when the lifeline is lost.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub fn lost(&self) -> WaitForCancellationFuture<'_> {
        self.inner.lost.cancelled()
    }
}

impl Default for Lifeline {
    fn default() -> Self {
        Lifeline::never()
    }
}

impl fmt::Debug for Lifeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lifeline")
            .field("lost", &self.is_lost())
            .field("hands_back_held", &self.hands_back_held())
            .finish()
    }
}

/// Where one delivery stands between its arrival and its handler: *held*
/// until the innermost part of the stack claims it, then *claimed* (in
/// flight) for good — unless the transport handed it back first. Every
/// copy of a delivery shares it (it lives in the part copies share: no
/// allocation of its own). The two writers race on one atomic and the
/// first wins: a claim after a hand-back is refused, a hand-back after a
/// claim does nothing.
///
/// std's atomic in every build (one compare-and-swap decides the race; a
/// delivery may be built outside a model-checked execution).
pub(crate) struct ClaimCell(std::sync::atomic::AtomicU8);

const HELD: u8 = 0;
const CLAIMED: u8 = 1;
const HANDED_BACK: u8 = 2;

impl ClaimCell {
    pub(crate) fn new() -> Self {
        ClaimCell(std::sync::atomic::AtomicU8::new(HELD))
    }

    /// Held → claimed. `true` if the delivery is claimed (now or before),
    /// `false` if it was handed back first.
    pub(crate) fn claim(&self) -> bool {
        match self
            .0
            .compare_exchange(HELD, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(now) => now == CLAIMED,
        }
    }

    /// Held → handed back. `true` if the delivery is handed back (now or
    /// before), `false` if it was claimed first.
    pub(crate) fn hand_back(&self) -> bool {
        match self
            .0
            .compare_exchange(HELD, HANDED_BACK, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(now) => now == HANDED_BACK,
        }
    }

    pub(crate) fn is_claimed(&self) -> bool {
        self.0.load(Ordering::Acquire) == CLAIMED
    }

    pub(crate) fn is_handed_back(&self) -> bool {
        self.0.load(Ordering::Acquire) == HANDED_BACK
    }
}

impl Clone for ClaimCell {
    // A delivery's shared part is copied only when a copy replaces its
    // lifeline before being cloned (`Delivery::set_lifeline`): the copy
    // starts where the original stands.
    fn clone(&self) -> Self {
        ClaimCell(std::sync::atomic::AtomicU8::new(
            self.0.load(Ordering::Acquire),
        ))
    }
}

impl fmt::Debug for ClaimCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0.load(Ordering::Relaxed) {
            HELD => "held",
            CLAIMED => "claimed",
            _ => "handed back",
        })
    }
}
