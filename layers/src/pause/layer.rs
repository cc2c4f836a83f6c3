use tower::Layer;

use super::{Pause, PauseHandle};

/// Puts a pause gate controlled by a [`PauseHandle`] in front of a service;
/// see the [module docs](super).
#[derive(Clone, Debug)]
pub struct PauseLayer {
    handle: PauseHandle,
}

impl PauseLayer {
    /// A gate controlled by `handle` (keep a clone of it to pause, resume
    /// and close).
    pub const fn new(handle: PauseHandle) -> Self {
        PauseLayer { handle }
    }
}

impl<S> Layer<S> for PauseLayer {
    type Service = Pause<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Pause::new(inner, self.handle.clone())
    }
}
