use std::time::Duration;

use tower::Layer;

use super::Cancel;
use crate::lifeline::Cancellation;
use crate::sync::CancellationToken;

/// Gives each request a child of a root token, catches panics and abandons
/// handlers that ignore cancellation; see the [module docs](super).
#[derive(Clone, Debug)]
pub struct CancelLayer {
    root: Root,
    abandon_after: Duration,
    self_waking: bool,
}

/// What a layer's services hand their requests.
#[derive(Clone, Debug)]
enum Root {
    // A view of this token, made for each service the layer builds.
    Token(CancellationToken),
    // This view, shared by every service the layer builds.
    View(Cancellation),
}

impl CancelLayer {
    /// How long a handler may run on after its token is cancelled before it
    /// is abandoned, unless [`abandon_after`](Self::abandon_after) says
    /// otherwise: 5 s.
    pub const DEFAULT_ABANDON_AFTER: Duration = Duration::from_secs(5);

    /// Children of `root` for every request; abandons after
    /// [`DEFAULT_ABANDON_AFTER`](Self::DEFAULT_ABANDON_AFTER).
    pub const fn new(root: CancellationToken) -> Self {
        CancelLayer {
            root: Root::Token(root),
            abandon_after: Self::DEFAULT_ABANDON_AFTER,
            self_waking: true,
        }
    }

    /// Hands every request `cancellation` itself. When the requests'
    /// [`Lifeline`](crate::Lifeline) carries that same view
    /// ([`Lifeline::with_cancellation`](crate::Lifeline::with_cancellation)),
    /// a request finds its token through the lifeline and the layer touches
    /// no reference count to hand it over: what a transport that builds
    /// one stack per generation does (acemq's consumer loop).
    pub const fn from_cancellation(cancellation: Cancellation) -> Self {
        CancelLayer {
            root: Root::View(cancellation),
            abandon_after: Self::DEFAULT_ABANDON_AFTER,
            self_waking: true,
        }
    }

    /// For a transport that wakes every running request itself when it
    /// cancels the root: the layer then registers no waiter per request
    /// (the cheapest path; acemq's consumer loop runs it so).
    ///
    /// The transport must run its requests in a
    /// [`Slots`](super::Slots) and call [`Slots::wake_all`](super::Slots::wake_all)
    /// when it cancels the root (what acemq's loop does: no allocation and
    /// no reference count per request), or wrap each request's future in a
    /// [`Wakeable`](super::future::Wakeable), call
    /// [`Wakeable::wake`](super::future::Wakeable::wake) on every running
    /// one when it cancels the root, and wrap a request it starts after
    /// that with [`Wakeable::after_cancel`](super::future::Wakeable::after_cancel)
    /// (a waker clone per request that waits); and it must poll them in its own task (not through a layer that
    /// moves them to another task, such as `tower::buffer`). Otherwise a
    /// handler that ignores its token and never wakes is never abandoned:
    /// leave this off, and the layer wakes itself (one waiter on a shared
    /// `Notify` per request that waits).
    pub const fn woken_by_transport(mut self) -> Self {
        self.self_waking = false;
        self
    }

    /// How long a handler may run on after its token is cancelled before
    /// it is abandoned (default
    /// [`DEFAULT_ABANDON_AFTER`](Self::DEFAULT_ABANDON_AFTER)).
    pub const fn abandon_after(mut self, abandon_after: Duration) -> Self {
        self.abandon_after = abandon_after;
        self
    }
}

impl<S> Layer<S> for CancelLayer {
    type Service = Cancel<S>;

    fn layer(&self, inner: S) -> Self::Service {
        let svc = match &self.root {
            Root::Token(root) => Cancel::new(inner, root.clone()),
            Root::View(view) => Cancel::from_cancellation(inner, view.clone()),
        }
        .abandon_after(self.abandon_after);
        if self.self_waking {
            svc
        } else {
            svc.woken_by_transport()
        }
    }
}
