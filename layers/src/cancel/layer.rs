use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tower::Layer;

use super::Cancel;

/// How long a handler may run on after its token is cancelled before it is
/// abandoned, unless [`CancelLayer::abandon_after`] says otherwise: 5 s.
pub const DEFAULT_ABANDON_AFTER: Duration = Duration::from_secs(5);

/// Gives each request a child of a root token, catches panics and abandons
/// handlers that ignore cancellation; see the [module docs](super).
#[derive(Clone, Debug)]
pub struct CancelLayer {
    root: CancellationToken,
    abandon_after: Duration,
}

impl CancelLayer {
    /// Children of `root` for every request; abandons after
    /// [`DEFAULT_ABANDON_AFTER`].
    pub const fn new(root: CancellationToken) -> Self {
        CancelLayer {
            root,
            abandon_after: DEFAULT_ABANDON_AFTER,
        }
    }

    /// How long a handler may run on after its token is cancelled before
    /// it is abandoned (default [`DEFAULT_ABANDON_AFTER`]).
    pub const fn abandon_after(mut self, abandon_after: Duration) -> Self {
        self.abandon_after = abandon_after;
        self
    }
}

impl<S> Layer<S> for CancelLayer {
    type Service = Cancel<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Cancel::new(inner, self.root.clone()).abandon_after(self.abandon_after)
    }
}
