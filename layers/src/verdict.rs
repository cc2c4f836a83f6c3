//! What a handler's `Ok` means: the handler's own say over its delivery.
//!
//! A handler's `Ok` is either `()` — acknowledge — or a [`Verdict`], when
//! the handler itself decides that a message it handled without failing
//! must go back to the queue or to the dead-letter queue. Any other `Ok`
//! type does not compile ([`IntoVerdict`] is implemented for these two
//! only): a handler returning `Ok(order)` would otherwise be acknowledged
//! silently, whatever it meant.
//!
//! ```compile_fail
//! use acemq_layers::{CancelLayer, Delivery};
//! use tokio_util::sync::CancellationToken;
//! use tower::{Service, ServiceBuilder};
//!
//! fn assert_handler<S: Service<Delivery>>(_: S) {}
//! // Does not compile: `Ok("any response")` would be acknowledged silently.
//! assert_handler(
//!     ServiceBuilder::new()
//!         .layer(CancelLayer::new(CancellationToken::new()))
//!         .service_fn(|_: Delivery| async { Ok::<_, std::io::Error>("any response") }),
//! );
//! ```
//!
//! An error is still the way to say "this failed": it is retried on the
//! schedule, or dead-lettered at once when it carries a
//! [`Reject`](crate::Reject).
//!
//! ```
//! use acemq_layers::{CancelLayer, Decision, Delivery, Verdict};
//! use tokio_util::sync::CancellationToken;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let svc = ServiceBuilder::new()
//!     .layer(CancelLayer::new(CancellationToken::new()))
//!     .service_fn(|d: Delivery| async move {
//!         Ok::<_, std::io::Error>(if d.body().is_empty() {
//!             Verdict::dead_letter("empty body")
//!         } else {
//!             Verdict::Ack
//!         })
//!     });
//! let decision = svc.oneshot(Delivery::builder().build()).await.unwrap();
//! assert!(matches!(decision, Decision::DeadLetter(d) if d.error == "empty body"));
//! # }
//! ```

use crate::decision::{DeadLetterDecision, Decision, Reason};

/// What a handler that returned `Ok` wants done with its delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Acknowledge: the same as returning `Ok(())`.
    Ack,
    /// Give the delivery back to the broker now, unsettled by this handler
    /// ([`Decision::Requeue`], sent as `basic.reject` with requeue, which
    /// quorum queues count): it is requeued and redelivered at once, at
    /// the same attempt number, to this or another consumer. No retry delay
    /// applies, so a handler that always requeues spins; on a quorum queue
    /// `max_redeliveries` ends that, on a classic queue nothing does (use an
    /// error to retry on the schedule instead).
    Requeue,
    /// Dead-letter now with reason `rejected` and this text as the error,
    /// like returning an error carrying a [`Reject`](crate::Reject).
    DeadLetter(String),
}

impl Verdict {
    /// [`Verdict::DeadLetter`] with `why` as the error text.
    pub fn dead_letter(why: impl Into<String>) -> Self {
        Verdict::DeadLetter(why.into())
    }

    /// The decision the consumer loop carries out, for a delivery at
    /// `attempt`.
    pub fn into_decision(self, attempt: u32) -> Decision {
        match self {
            Verdict::Ack => Decision::Ack,
            Verdict::Requeue => Decision::Requeue,
            Verdict::DeadLetter(error) => Decision::DeadLetter(DeadLetterDecision {
                reason: Reason::Rejected,
                error,
                attempts: attempt,
                published: false,
            }),
        }
    }
}

/// The `Ok` types a handler may return: `()` (acknowledge) and [`Verdict`].
///
/// Sealed: no other type can mean something acemq would carry out.
#[diagnostic::on_unimplemented(
    message = "a handler must return `Ok(())` or `Ok(Verdict)`, not `Ok({Self})`",
    label = "the handler's `Ok` type is `{Self}`",
    note = "acemq would acknowledge every `Ok` alike and drop the value: return `Ok(())` to \
            acknowledge, or an `Verdict` (Ack, Requeue, DeadLetter) to decide; map the value \
            away with `.map(|_| ())` if it does not matter"
)]
pub trait IntoVerdict: sealed::Sealed {
    /// The verdict this value stands for.
    fn into_verdict(self) -> Verdict;
}

impl IntoVerdict for () {
    fn into_verdict(self) -> Verdict {
        Verdict::Ack
    }
}

impl IntoVerdict for Verdict {
    fn into_verdict(self) -> Verdict {
        self
    }
}

/// The inbox layer's answer: a duplicate is acknowledged (the work was done
/// once already); a handled delivery is what its handler said.
impl<R: IntoVerdict> IntoVerdict for crate::inbox::InboxOutcome<R> {
    fn into_verdict(self) -> Verdict {
        match self {
            crate::inbox::InboxOutcome::Handled(r) => r.into_verdict(),
            crate::inbox::InboxOutcome::Duplicate => Verdict::Ack,
        }
    }
}

mod sealed {
    #[allow(unreachable_pub)] // public in a private module: the seal
    pub trait Sealed {}
    impl Sealed for () {}
    impl Sealed for super::Verdict {}
    impl<R: Sealed> Sealed for crate::inbox::InboxOutcome<R> {}
}
