//! Per-key ordering: deliveries with equal keys run one at a time, in the
//! order they arrived; different keys run side by side.
//!
//! [`PartitionLayer`] keys each delivery with a [`Key`] — a ready-made
//! [`OrderedBy`] (a header, the routing key, the message id, or a
//! [`KeyFn`] that may leave what it parsed for the handler) or a closure
//! over the [`Delivery`] — and keeps the key as a 64-bit hash
//! ([`key_hash`]: no allocation per delivery). Then:
//!
//! - a delivery whose key is free is called at once, and holds its key
//!   until its response future completes (or is dropped);
//! - a delivery whose key is held waits in that key's line, in arrival
//!   order, and is called when the key passes to it;
//! - a delivery without a key ([`Key::key`] is `None`) runs at once,
//!   unordered.
//!
//! Equal keys never run at the same time, and start in arrival order (the
//! order of `call`). Two different keys with one hash are serialised like
//! equal ones — a collision costs parallelism, never order.
//!
//! # Held, not in flight
//!
//! A delivery waiting for its key's turn is *held* (see the
//! [in-flight module](crate::in_flight#held-until-claimed)): the service
//! below is not called, so nothing below the layer counts it. In
//! particular it holds no concurrency permit: the ready service below
//! stays with the layer for the next delivery that can run, and a waiter
//! makes a clone of it ready only when its turn has come. So one hot key
//! cannot take every permit and starve the other keys: different keys run
//! up to the concurrency below. A transport that hands back what is held
//! (acemq's drain) drops a waiter's future; it leaves its line, and the key
//! passes on if it had come to it.
//!
//! # Bounds and backpressure
//!
//! At most [`max_waiting_per_key`](PartitionLayer::max_waiting_per_key)
//! deliveries wait for one key and
//! [`max_waiting`](PartitionLayer::max_waiting) for all keys together;
//! while a bound is reached, `poll_ready` is `Pending` (and is woken when
//! a line moves), so the caller — acemq's consumer loop, bounded by the
//! broker's prefetch — keeps the rest. Memory is bounded by the prefetch,
//! not by the traffic.
//!
//! # Retries
//!
//! The key is held until the layers below return: put the layer outside
//! the retry layer (acemq puts your outer layers there) and an in-process
//! retry keeps the key — the next delivery of that key waits for the
//! retried one's final outcome. A retry that goes through a broker rung
//! gives the order up for that message: it is acknowledged here, waits on
//! the rung and comes back at the end of the queue, after deliveries of its
//! key that arrived meanwhile (which may already have run).
//!
//! # Cost
//!
//! A delivery whose key is free and waited for by no one takes no lock: the
//! key goes into one of 256 slots (chosen by the key's low bits) with one
//! compare-and-swap, and leaves it with another when the delivery ends; no
//! allocation. Only what a slot's word cannot say goes to a locked map of
//! the running keys: a second delivery of a running key (it waits there in
//! its line), or a different key whose slot is taken. The slot then stays
//! with the lock until the map holds none of its keys. A waiting delivery
//! allocates its place in the line; the map allocates nothing once it has
//! grown to the number of keys it holds at once.
//!
//! # Example
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use acemq_layers::partition::{OrderedBy, PartitionLayer};
//! use acemq_layers::{Delivery, Headers, Value};
//! use tower::{Service, ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let log = seen.clone();
//! let mut svc = ServiceBuilder::new()
//!     .layer(PartitionLayer::new(OrderedBy::header("x-customer")))
//!     .service_fn(move |d: Delivery| {
//!         let log = log.clone();
//!         async move {
//!             tokio::task::yield_now().await;
//!             log.lock().unwrap().push(String::from_utf8_lossy(d.body()).into_owned());
//!             Ok::<_, std::io::Error>(())
//!         }
//!     });
//! let order = |customer: &str, body: &str| {
//!     let mut headers = Headers::new();
//!     headers.insert("x-customer", Value::String(customer.as_bytes().to_vec()));
//!     Delivery::builder().headers(headers).body(body.to_owned()).build()
//! };
//! // Two orders of one customer: the second waits for the first.
//! let first = svc.ready().await.unwrap().call(order("ada", "ada-1"));
//! let second = svc.ready().await.unwrap().call(order("ada", "ada-2"));
//! let (a, b) = tokio::join!(second, first);
//! a.unwrap();
//! b.unwrap();
//! assert_eq!(*seen.lock().unwrap(), ["ada-1", "ada-2"]);
//! # }
//! ```
//!
//! A key from the body that the handler finds again, parsed once
//! ([`KeyFn::hashed`] leaves the key in the delivery's extensions as an
//! [`OrderingKey`]; [`KeyFn::new`] can leave anything there):
//!
//! ```
//! use acemq_layers::partition::{KeyFn, OrderedBy, OrderingKey, PartitionLayer};
//! use acemq_layers::Delivery;
//!
//! // The account is the body's first line.
//! let by_account = KeyFn::hashed("account", |d: &Delivery| {
//!     let line = d.body().split(|b| *b == b'\n').next()?;
//!     Some(String::from_utf8_lossy(line).into_owned())
//! });
//! let layer = PartitionLayer::new(OrderedBy::Fn(by_account));
//! // In the handler:
//! fn account(d: &Delivery) -> Option<&str> {
//!     d.extensions().get::<OrderingKey<String>>().map(|k| k.0.as_str())
//! }
//! # let _ = (layer, account);
//! ```
//!
//! A key of your own, from a closure:
//!
//! ```
//! use acemq_layers::partition::{key_hash, PartitionLayer};
//! use acemq_layers::Delivery;
//!
//! // The account is the first 8 bytes of the body.
//! let layer = PartitionLayer::new(|d: &Delivery| d.body().get(..8).map(key_hash))
//!     .max_waiting_per_key(64)
//!     .max_waiting(512);
//! # let _ = layer;
//! ```

pub mod future;
mod key;
mod layer;
mod service;
mod table;
// Not in the model-checking build: these run on tokio and std, outside loom.
#[cfg(all(test, not(acemq_loom)))]
mod key_tests;
#[cfg(all(test, not(acemq_loom)))]
mod tests;

pub use key::{key_hash, Key, KeyFn, OrderedBy, OrderingKey};
pub use layer::{PartitionLayer, DEFAULT_MAX_WAITING, DEFAULT_MAX_WAITING_PER_KEY};
pub use service::Partition;

use crate::Delivery;
