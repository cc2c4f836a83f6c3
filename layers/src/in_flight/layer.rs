use tower::Layer;

use super::{InFlight, InFlightCounter};

/// Counts requests in flight in an [`InFlightCounter`]; see the
/// [module docs](super).
#[derive(Clone, Debug)]
pub struct InFlightLayer {
    counter: InFlightCounter,
}

impl InFlightLayer {
    /// Counts into `counter` (keep a clone of it to read the counts).
    pub const fn new(counter: InFlightCounter) -> Self {
        InFlightLayer { counter }
    }
}

impl<S> Layer<S> for InFlightLayer {
    type Service = InFlight<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlight::new(inner, self.counter.clone())
    }
}
