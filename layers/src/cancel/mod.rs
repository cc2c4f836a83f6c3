//! A read-only view of the root cancellation token per request, a caught
//! panic, and abandonment of a handler that ignores its token.
//!
//! [`CancelLayer`] is the innermost acemq layer, right around the handler.
//! For each request it:
//!
//! 1. gives the delivery a read-only view of the root token
//!    ([`Delivery::token`], a [`Cancellation`](crate::Cancellation): one
//!    reference count, no allocation): cancelling the root (the drain does,
//!    once its deadline has passed) reaches every running handler; a handler
//!    cannot cancel it, and stops sub-tasks of its own with
//!    [`child_token`](crate::Cancellation::child_token), which reaches
//!    nothing else;
//! 2. turns the handler's result into a [`Decision`]: `Ok(())` is
//!    [`Decision::Ack`], `Ok(outcome)` what the [`Verdict`](crate::Verdict)
//!    says (any other `Ok` type does not compile, see
//!    [`IntoVerdict`](crate::IntoVerdict)); an error is `Err` (boxed) for the retry and
//!    dead-letter layers to judge — unless the delivery's token was
//!    cancelled, in which case the handler stopped because it was told to,
//!    which is no failure: [`Decision::HandBack`];
//! 3. catches a panic in the handler (in `call` or in any poll of its
//!    future) and returns it as an `Err` holding a
//!    [`HandlerPanic`](crate::HandlerPanic), which the
//!    [`DefaultClassifier`](crate::DefaultClassifier) classes as
//!    [`Class::Panic`](crate::Class::Panic);
//! 4. abandons a handler that is still running
//!    [`abandon_after`](CancelLayer::abandon_after) (default
//!    [`CancelLayer::DEFAULT_ABANDON_AFTER`], 5 s) after its token was cancelled: the
//!    handler's future is dropped and the request resolves to
//!    [`Decision::Abandoned`].
//!
//! # Semantics
//!
//! - The layer registers interest in the token only once the handler's
//!   future has returned `Pending`: a handler that finishes in its first poll
//!   costs no waiter and no timer. A handler that waits costs one waiter on a
//!   `Notify` the layer's views share (two uncontended locks), not one on the
//!   tokio-util token (five). The first such wait in a tokio runtime spawns
//!   one small task per layer that turns the token's cancellation into a
//!   wake-up of every waiter; it ends when the token fires or the layer and
//!   its requests are gone, and a runtime that drops it gets another on its
//!   next wait. Outside a tokio runtime the layer waits on the token itself.
//! - [`CancelLayer::woken_by_transport`] leaves the waking to the transport
//!   (acemq's consumer loop): the layer registers nothing, the transport
//!   runs its requests in a [`Slots`] (each slot's waker made once: nothing
//!   per request) and wakes them all when it cancels the root — or wraps
//!   each request's future in a [`Wakeable`] (a waker clone per request
//!   that waits) when it polls them some other way.
//! - [`CancelLayer::from_cancellation`] gives the layer a view made once
//!   (not one per service it builds). When the requests' lifeline carries
//!   that same view ([`Lifeline::with_cancellation`](crate::Lifeline::with_cancellation),
//!   one per generation of a transport), a request finds its token through
//!   the lifeline it already shares and the layer hands nothing over: one
//!   reference count per request (the one its future keeps) instead of two.
//!   acemq's consumer loop runs it so.
//! - The grace period starts when the layer sees the cancellation (woken
//!   by the watcher a task switch after the cancel, or polled again), and is
//!   measured on tokio's clock.
//! - A handler that listens to its token (`token().cancelled()` in a
//!   `select!`) and returns early ends with `HandBack` (on an error) or `Ack`
//!   (on `Ok`): both settle the delivery as the handler meant.
//!
//! # Order
//!
//! Innermost: each attempt of the retry layer is watched on its own, a
//! panic is caught where it happens, and abandonment drops exactly the
//! handler's future.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use acemq_layers::{CancelLayer, Decision, Delivery};
//! use tokio_util::sync::CancellationToken;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let root = CancellationToken::new();
//! let svc = ServiceBuilder::new()
//!     .layer(CancelLayer::new(root.clone()).abandon_after(Duration::from_secs(1)))
//!     .service_fn(|d: Delivery| async move {
//!         // A handler that listens: it stops when told to.
//!         d.token().cancelled().await;
//!         Err::<(), _>(std::io::Error::other("stopped"))
//!     });
//! root.cancel();
//! let decision = svc.oneshot(Delivery::builder().build()).await.unwrap();
//! assert_eq!(decision, Decision::HandBack);
//! # }
//! ```

pub mod future;
mod layer;
mod service;
mod slots;

pub use future::Wakeable;
pub use layer::CancelLayer;
pub use service::Cancel;
pub use slots::Slots;

use crate::{BoxError, Decision, Delivery};
