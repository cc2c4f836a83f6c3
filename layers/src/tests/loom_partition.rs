//! The partition table's lock-free path (a key with no waiter takes and
//! frees its slot with one compare-and-swap) against the locked table it
//! hands a slot over to: a release racing an arrival of the same key, and
//! a key sharing a slot with a running one.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use loom::future::block_on;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Mutex;
use loom::thread;
use tower::{Layer, Service};

use super::model;
use crate::partition::PartitionLayer;
use crate::Delivery;

/// A handler that logs the first byte of each body as it is called and
/// fails the model if two deliveries run at once (every delivery of a
/// model that uses it has one key).
#[derive(Clone, Debug, Default)]
struct OneAtATime {
    running: Arc<AtomicUsize>,
    called: Arc<Mutex<Vec<u8>>>,
}

impl OneAtATime {
    fn order(&self) -> Vec<u8> {
        self.called.lock().unwrap().clone()
    }
}

impl Service<Delivery> for OneAtATime {
    type Response = ();
    type Error = Infallible;
    type Future = Ends;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, d: Delivery) -> Ends {
        let before = self.running.fetch_add(1, Ordering::SeqCst);
        assert_eq!(before, 0, "two deliveries of one key run at once");
        self.called.lock().unwrap().push(d.body()[0]);
        Ends(self.running.clone())
    }
}

/// The handler's run: it ends when first polled.
struct Ends(Arc<AtomicUsize>);

impl Future for Ends {
    type Output = Result<(), Infallible>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.fetch_sub(1, Ordering::SeqCst);
        Poll::Ready(Ok(()))
    }
}

/// A delivery whose key is `key`, logged as `tag`.
fn delivery(key: u8, tag: u8) -> Delivery {
    Delivery::builder().body(vec![tag, key]).build()
}

/// The key is the body's second byte.
fn by_second_byte(d: &Delivery) -> Option<u64> {
    d.body().get(1).map(|b| u64::from(*b))
}

// The holder of a key releasing it (lock-free: no one waited when it
// started) while a delivery of the same key arrives: the arrival takes the
// free slot, or waits in the locked table and is passed the key. Never two
// at once, never left waiting; at the end no key runs and no slot is left
// with the lock.
#[test]
fn a_keys_release_racing_an_arrival_of_the_same_key_passes_it_on() {
    model(|| {
        let handler = OneAtATime::default();
        let layer = PartitionLayer::new(by_second_byte as fn(&Delivery) -> Option<u64>);
        let mut svc = layer.layer(handler.clone());
        let first = svc.call(delivery(1, 1));
        let holder = thread::spawn(move || block_on(first).unwrap());
        block_on(svc.call(delivery(1, 2))).unwrap();
        holder.join().unwrap();
        assert_eq!(handler.order(), [1, 2]);
        assert_eq!((layer.waiting(), svc.keys_and_locked_slots()), (0, (0, 0)));
    });
}

// A key that shares its slot with a running key (5 and 1, of 4 slots under
// loom) arrives as the running key ends: it runs at once either way, the
// running key is moved into the locked table or has freed the slot, and
// once both end the slot is free for the lock-free path again.
#[test]
fn a_key_sharing_a_running_keys_slot_runs_beside_it_and_the_slot_frees() {
    model(|| {
        let layer = PartitionLayer::new(by_second_byte as fn(&Delivery) -> Option<u64>);
        let (one, five) = (OneAtATime::default(), OneAtATime::default());
        let mut svc_one = layer.layer(one.clone());
        let mut svc_five = layer.layer(five.clone());
        let first = svc_one.call(delivery(1, 1));
        let holder = thread::spawn(move || block_on(first).unwrap());
        block_on(svc_five.call(delivery(5, 5))).unwrap();
        holder.join().unwrap();
        assert_eq!((one.order(), five.order()), (vec![1], vec![5]));
        assert_eq!(svc_one.keys_and_locked_slots(), (0, 0));
    });
}

// A key's holder ends while a delivery waits for the key and a third of
// the same key arrives: the waiter runs before the newcomer (arrival
// order), one at a time.
#[test]
fn a_waiter_is_passed_the_key_before_a_later_arrival() {
    model(|| {
        let handler = OneAtATime::default();
        let layer = PartitionLayer::new(by_second_byte as fn(&Delivery) -> Option<u64>);
        let mut svc = layer.layer(handler.clone());
        let first = svc.call(delivery(1, 1));
        let second = svc.call(delivery(1, 2));
        let holder = thread::spawn(move || block_on(first).unwrap());
        let waiter = thread::spawn(move || block_on(second).unwrap());
        block_on(svc.call(delivery(1, 3))).unwrap();
        holder.join().unwrap();
        waiter.join().unwrap();
        assert_eq!(handler.order(), [1, 2, 3]);
        assert_eq!((layer.waiting(), svc.keys_and_locked_slots()), (0, (0, 0)));
    });
}
