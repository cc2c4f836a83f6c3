//! [`ConsumerTimeoutStrikes`]: what the transport tells the redelivery
//! limit about a message whose acknowledgement the broker timed out.

/// How often the broker timed out this message's acknowledgement
/// (`consumer_timeout`), and the queue's bound on it.
///
/// The transport (the `acemq` consumer loop) counts these strikes itself —
/// no header carries them — and puts this in the delivery's
/// [extensions](crate::Delivery::extensions_mut) when a message it struck
/// comes back. [`RedeliveryLimit`](super::RedeliveryLimit) dead-letters a
/// delivery with `strikes >= limit` with reason
/// [`Reason::ConsumerTimeout`](crate::Reason::ConsumerTimeout), without
/// calling the service below.
///
/// ```
/// use acemq_layers::redelivery::ConsumerTimeoutStrikes;
/// use acemq_layers::{Decision, Delivery, Reason, RedeliveryLimitLayer};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let svc = ServiceBuilder::new()
///     .layer(RedeliveryLimitLayer::new(50))
///     .service_fn(|_: Delivery| async { Ok::<_, std::io::Error>(Decision::Ack) });
/// let mut delivery = Delivery::builder().queue("orders").build();
/// delivery
///     .extensions_mut()
///     .insert(ConsumerTimeoutStrikes::new(2, 2));
/// let Decision::DeadLetter(d) = svc.oneshot(delivery).await.unwrap() else { panic!() };
/// assert_eq!(d.reason, Reason::ConsumerTimeout);
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumerTimeoutStrikes {
    /// Times the broker timed out this message's acknowledgement.
    pub strikes: u32,
    /// The queue's bound (`consumer_timeout_strikes`).
    pub limit: u32,
}

impl ConsumerTimeoutStrikes {
    /// `strikes` so far, against `limit`.
    pub const fn new(strikes: u32, limit: u32) -> Self {
        ConsumerTimeoutStrikes { strikes, limit }
    }

    /// Whether the bound is reached: the delivery is dead-lettered.
    pub const fn struck_out(&self) -> bool {
        self.strikes >= self.limit
    }
}
