//! [`MalformedHeaders`]: what the transport tells the redelivery limit
//! about a delivery whose headers it would not read.

use std::borrow::Cow;

/// The transport read this delivery's headers table and set it aside: it
/// was nested too deep, held too many values, or could not be parsed at
/// all. The delivery arrives with no headers, and
/// [`RedeliveryLimit`](super::RedeliveryLimit) dead-letters it with reason
/// [`Reason::MalformedHeaders`](crate::Reason::MalformedHeaders) without
/// calling the service below: a handler never sees a message whose
/// attempt, provenance and trace headers were lost, and the dead-letter
/// copy carries none of what was set aside.
///
/// The `acemq` consumer loop puts this in the delivery's
/// [extensions](crate::Delivery::extensions_mut).
///
/// ```
/// use acemq_layers::redelivery::MalformedHeaders;
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
///     .insert(MalformedHeaders::new("headers nested deeper than 32 levels"));
/// let Decision::DeadLetter(d) = svc.oneshot(delivery).await.unwrap() else { panic!() };
/// assert_eq!(d.reason, Reason::MalformedHeaders);
/// assert!(d.error.contains("nested deeper than 32 levels"));
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MalformedHeaders {
    why: Cow<'static, str>,
}

impl MalformedHeaders {
    /// Headers set aside for the reason `why` (said in the dead-letter
    /// copy's error).
    pub fn new(why: impl Into<Cow<'static, str>>) -> Self {
        MalformedHeaders { why: why.into() }
    }

    /// Why the headers were set aside.
    pub fn why(&self) -> &str {
        &self.why
    }
}
