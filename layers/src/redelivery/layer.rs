use tower::Layer;

use super::RedeliveryLimit;

/// Dead-letters, without calling the service below, a delivery the broker
/// redelivered more than `max` times; see the [module docs](super).
#[derive(Clone, Copy, Debug)]
pub struct RedeliveryLimitLayer {
    max: u32,
    reads_counts: bool,
}

impl RedeliveryLimitLayer {
    /// The default bound on broker redeliveries: 50, well above what
    /// deploys, drains and reconnects cause.
    pub const DEFAULT_MAX_REDELIVERIES: u32 = 50;

    /// At most `max` redeliveries (`x-delivery-count` up to `max` passes).
    pub const fn new(max: u32) -> Self {
        RedeliveryLimitLayer {
            max,
            reads_counts: true,
        }
    }

    /// The bound.
    pub const fn max(&self) -> u32 {
        self.max
    }

    /// Leaves `x-delivery-count` and `x-acquired-count` unread: for a
    /// queue whose broker does not set them (a classic queue), where they
    /// can only be what the publisher sent. A publisher could otherwise
    /// dead-letter a first delivery unread with a count of 2^62. Consumer
    /// timeout strikes and malformed headers still apply.
    pub const fn without_counts(self) -> Self {
        RedeliveryLimitLayer {
            reads_counts: false,
            ..self
        }
    }

    /// Whether the broker's redelivery counts are read (see
    /// [`without_counts`](Self::without_counts)).
    pub const fn reads_counts(&self) -> bool {
        self.reads_counts
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
        RedeliveryLimit::with_limit(inner, *self)
    }
}
