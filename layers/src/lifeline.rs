//! What a handler may know about its delivery's fate without being able to
//! change it: a [`Cancellation`] it can wait on (but not trigger), and a
//! [`Lifeline`] that says whether the channel the delivery came on is gone.

use std::fmt;
use std::sync::{Arc, OnceLock};

use tokio_util::sync::{
    CancellationToken, WaitForCancellationFuture, WaitForCancellationFutureOwned,
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
    token: Arc<CancellationToken>,
}

impl Cancellation {
    /// A view of `token`.
    pub fn new(token: CancellationToken) -> Self {
        Cancellation {
            token: Arc::new(token),
        }
    }

    /// One that never fires (shared: cloning it allocates nothing).
    pub fn never() -> Self {
        Cancellation::never_ref().clone()
    }

    /// The one that never fires, borrowed (no reference count touched).
    pub(crate) fn never_ref() -> &'static Cancellation {
        static NEVER: OnceLock<Cancellation> = OnceLock::new();
        NEVER.get_or_init(|| Cancellation::new(CancellationToken::new()))
    }

    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves when cancellation is requested.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: dropping the future loses nothing.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// As [`cancelled`](Self::cancelled), owning what it needs (a `'static`
    /// future to move into a task).
    pub fn cancelled_owned(&self) -> WaitForCancellationFutureOwned {
        (*self.token).clone().cancelled_owned()
    }

    /// A token of your own that is cancelled when this one is: cancel it to
    /// stop your own sub-tasks; that reaches nothing else.
    pub fn child_token(&self) -> CancellationToken {
        self.token.child_token()
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
#[derive(Clone)]
pub struct Lifeline {
    lost: Arc<CancellationToken>,
}

impl Lifeline {
    /// A live lifeline for a new generation.
    pub fn new() -> Self {
        Lifeline {
            lost: Arc::new(CancellationToken::new()),
        }
    }

    /// One that is never lost (shared: cloning it allocates nothing); what
    /// a delivery built without a transport has.
    pub fn never() -> Self {
        static NEVER: OnceLock<Lifeline> = OnceLock::new();
        NEVER.get_or_init(Lifeline::new).clone()
    }

    /// The channel is gone: every delivery of this generation is orphaned.
    pub fn lose(&self) {
        self.lost.cancel();
    }

    /// Whether [`lose`](Self::lose) was called.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Resolves when the lifeline is lost.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub fn lost(&self) -> WaitForCancellationFuture<'_> {
        self.lost.cancelled()
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
            .finish()
    }
}
