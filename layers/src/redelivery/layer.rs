use tower::Layer;

use super::RedeliveryLimit;

/// Dead-letters, without calling the service below, a delivery the broker
/// redelivered more than `max` times; see the [module docs](super).
#[derive(Clone, Copy, Debug)]
pub struct RedeliveryLimitLayer {
    max: u32,
}

impl RedeliveryLimitLayer {
    /// The default bound on broker redeliveries: 50, well above what
    /// deploys, drains and reconnects cause.
    pub const DEFAULT_MAX_REDELIVERIES: u32 = 50;

    /// At most `max` redeliveries (`x-delivery-count` up to `max` passes).
    pub const fn new(max: u32) -> Self {
        RedeliveryLimitLayer { max }
    }

    /// The bound.
    pub const fn max(&self) -> u32 {
        self.max
    }
}

impl Default for RedeliveryLimitLayer {
    /// [`DEFAULT_MAX_REDELIVERIES`](Self::DEFAULT_MAX_REDELIVERIES).
    fn default() -> Self {
        RedeliveryLimitLayer::new(Self::DEFAULT_MAX_REDELIVERIES)
    }
}

impl<S> Layer<S> for RedeliveryLimitLayer {
    type Service = RedeliveryLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RedeliveryLimit::new(inner, self.max)
    }
}
