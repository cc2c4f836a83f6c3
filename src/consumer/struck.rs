//! [`Struck`]: the loop's wrapper around a generation's stack that knows
//! each delivery by its strike key and tells the stack about a message
//! whose acknowledgement the broker has timed out before.

use std::sync::Arc;
use std::task::{Context, Poll};

use acemq_layers::redelivery::ConsumerTimeoutStrikes;
use acemq_layers::Delivery;
use tower::Service;
use tracing::warn;

use super::stats::QueueStats;
use super::strikes::Key;

/// Computes each delivery's strike key (kept for the loop, which records
/// it with the started delivery) and, for a message struck before, puts
/// [`ConsumerTimeoutStrikes`] in its extensions: the stack's redelivery
/// limit dead-letters it as `consumer-timeout` once it has struck out.
pub(super) struct Struck<S> {
    inner: S,
    stats: Arc<QueueStats>,
    /// The queue's `consumer_timeout_strikes`.
    limit: u32,
    /// The key of the delivery last called, until the loop takes it.
    last: Key,
}

impl<S> Struck<S> {
    pub(super) fn new(inner: S, stats: Arc<QueueStats>, limit: u32) -> Self {
        Struck {
            inner,
            stats,
            limit,
            last: Key::default(),
        }
    }

    /// The strike key of the delivery last called (taken: asked once).
    pub(super) fn take_last_key(&mut self) -> Key {
        std::mem::take(&mut self.last)
    }

    /// The queue's `consumer_timeout_strikes`.
    pub(super) fn limit(&self) -> u32 {
        self.limit
    }
}

impl<S> Service<Delivery> for Struck<S>
where
    S: Service<Delivery>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut delivery: Delivery) -> Self::Future {
        // Nothing struck: no lookup, and nothing digested (the key keeps
        // the delivery, for a timeout to strike it by).
        let (key, strikes) = if self.stats.strikes.is_empty() {
            (Key::of(&delivery), 0)
        } else {
            let key = Key::taken(&delivery);
            let strikes = self.stats.strikes.get(key.value());
            (key, strikes)
        };
        self.last = key;
        if strikes > 0 {
            let s = ConsumerTimeoutStrikes::new(strikes, self.limit);
            if s.struck_out() {
                warn!(
                    queue = %delivery.queue(),
                    message_id = delivery.properties().message_id.as_deref().unwrap_or(""),
                    strikes,
                    consumer_timeout_strikes = self.limit,
                    "the broker timed out this message's acknowledgement {strikes} times \
                     (consumer_timeout): dead-lettering it as consumer-timeout without calling \
                     the handler again; raise the broker's consumer_timeout above the handler's \
                     longest run, bound the handler's time below it (a timeout layer), and keep \
                     shutdown_timeout + abandon_after below it, or raise \
                     consumer_timeout_strikes"
                );
            }
            delivery.extensions_mut().insert(s);
        }
        self.inner.call(delivery)
    }
}
