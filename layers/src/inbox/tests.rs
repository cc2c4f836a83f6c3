use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tower::{Layer, Service, ServiceBuilder, ServiceExt};

use super::*;
use crate::{BoxError, Delivery, Properties, Reject};

fn delivery(queue: &str, id: Option<&str>) -> Delivery {
    let props = Properties {
        message_id: id.map(str::to_owned),
        ..Properties::default()
    };
    Delivery::builder().queue(queue).properties(props).build()
}

#[derive(Clone, Default)]
struct Work {
    calls: Arc<AtomicUsize>,
    fail_first: Arc<AtomicUsize>,
}

impl Work {
    fn service(&self) -> impl Service<Delivery, Response = (), Error = BoxError> + Clone {
        let this = self.clone();
        tower::service_fn(move |d: Delivery| {
            let this = this.clone();
            async move {
                assert!(
                    d.extensions().get::<MemoryTransaction>().is_some(),
                    "the handler gets the inbox's transaction"
                );
                this.calls.fetch_add(1, Ordering::SeqCst);
                if this.fail_first.load(Ordering::SeqCst) > 0 {
                    this.fail_first.fetch_sub(1, Ordering::SeqCst);
                    return Err::<(), BoxError>("transient".into());
                }
                Ok(())
            }
        })
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_second_delivery_of_the_same_id_on_the_same_queue_is_skipped() {
    let store = MemoryInbox::new();
    let work = Work::default();
    let mut svc = InboxLayer::new(store.clone()).layer(work.service());
    let a = svc
        .ready()
        .await
        .unwrap()
        .call(delivery("q", Some("m1")))
        .await;
    let b = svc
        .ready()
        .await
        .unwrap()
        .call(delivery("q", Some("m1")))
        .await;
    assert_eq!(a.unwrap(), InboxOutcome::Handled(()));
    assert_eq!(b.unwrap(), InboxOutcome::Duplicate);
    assert_eq!(work.calls.load(Ordering::SeqCst), 1);
    assert!(store.contains("q", "m1"));
}

#[tokio::test(flavor = "current_thread")]
async fn the_same_id_on_another_queue_is_handled_again() {
    let work = Work::default();
    let mut svc = InboxLayer::new(MemoryInbox::new()).layer(work.service());
    for q in ["a", "b"] {
        let r = svc
            .ready()
            .await
            .unwrap()
            .call(delivery(q, Some("m1")))
            .await;
        assert_eq!(r.unwrap(), InboxOutcome::Handled(()));
    }
    assert_eq!(work.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_handler_leaves_no_mark_so_the_redelivery_is_handled() {
    let store = MemoryInbox::new();
    let work = Work::default();
    work.fail_first.store(1, Ordering::SeqCst);
    let mut svc = InboxLayer::new(store.clone()).layer(work.service());
    let first = svc
        .ready()
        .await
        .unwrap()
        .call(delivery("q", Some("m1")))
        .await;
    assert_eq!(first.unwrap_err().to_string(), "transient");
    assert!(!store.contains("q", "m1"), "rolled back with the work");
    let again = svc
        .ready()
        .await
        .unwrap()
        .call(delivery("q", Some("m1")))
        .await;
    assert_eq!(again.unwrap(), InboxOutcome::Handled(()));
    assert_eq!(work.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "current_thread")]
async fn a_delivery_without_message_id_is_handled_by_default_and_leaves_no_mark() {
    let store = MemoryInbox::new();
    let work = Work::default();
    let mut svc = InboxLayer::new(store.clone()).layer(work.service());
    for _ in 0..2 {
        let r = svc.ready().await.unwrap().call(delivery("q", None)).await;
        assert_eq!(r.unwrap(), InboxOutcome::Handled(()));
    }
    assert_eq!(work.calls.load(Ordering::SeqCst), 2);
    assert!(store.is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn a_delivery_without_message_id_is_rejected_when_configured() {
    let work = Work::default();
    let svc = ServiceBuilder::new()
        .layer(InboxLayer::new(MemoryInbox::new()).missing_id(MissingId::Reject))
        .service(work.service());
    let err = svc.oneshot(delivery("orders", None)).await.unwrap_err();
    assert!(err.is::<Reject>(), "permanent: {err}");
    assert!(
        err.to_string().contains("\"orders\" has no message id"),
        "{err}"
    );
    assert_eq!(work.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn a_handler_future_dropped_unfinished_leaves_no_mark() {
    let store = MemoryInbox::new();
    let svc = InboxLayer::new(store.clone()).layer(tower::service_fn(|_d: Delivery| async {
        std::future::pending::<()>().await;
        Ok::<_, BoxError>(())
    }));
    let fut = svc.oneshot(delivery("q", Some("m1")));
    let polled = tokio::time::timeout(std::time::Duration::from_millis(10), fut).await;
    assert!(polled.is_err());
    assert!(!store.contains("q", "m1"));
}

#[tokio::test(flavor = "current_thread")]
async fn a_duplicate_is_counted_for_its_queue() {
    let store = MemoryInbox::new();
    let work = Work::default();
    let mut svc = InboxLayer::new(store).layer(work.service());
    let queue = "inbox-tests.counted";
    assert_eq!(duplicates(queue), 0);
    for _ in 0..3 {
        svc.ready()
            .await
            .unwrap()
            .call(delivery(queue, Some("m1")))
            .await
            .unwrap();
    }
    assert_eq!(duplicates(queue), 2);
    assert_eq!(duplicates("inbox-tests.other"), 0);
}

fn body_delivery(queue: &str, body: &str) -> Delivery {
    Delivery::builder()
        .queue(queue)
        .body(body.to_owned())
        .build()
}

#[tokio::test(flavor = "current_thread")]
async fn a_key_from_the_body_skips_a_second_delivery_of_the_same_event_without_message_id() {
    let store = MemoryInbox::new();
    let work = Work::default();
    let mut svc = InboxLayer::new(store.clone())
        .key_fn(|d| {
            let event = std::str::from_utf8(d.body()).ok()?.split(':').next()?;
            Some(event.to_owned())
        })
        .missing_id(MissingId::Reject)
        .layer(work.service());
    let mut outcomes = Vec::new();
    for body in ["e-1:first", "e-1:again", "e-2:other"] {
        let r = svc.ready().await.unwrap().call(body_delivery("q", body));
        outcomes.push(r.await.unwrap());
    }
    assert_eq!(
        outcomes,
        [
            InboxOutcome::Handled(()),
            InboxOutcome::Duplicate,
            InboxOutcome::Handled(())
        ]
    );
    assert_eq!(work.calls.load(Ordering::SeqCst), 2);
    assert!(store.contains("q", "e-1") && store.contains("q", "e-2"));
    // The function's `None` (here: an empty body's empty key) is no key.
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(body_delivery("q", ""))
        .await
        .unwrap_err();
    assert!(err.is::<Reject>(), "{err}");
    assert_eq!(work.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "current_thread")]
async fn writes_recorded_in_the_memory_transaction_are_kept_at_commit_only() {
    let store = MemoryInbox::new();
    let mut svc =
        InboxLayer::new(store.clone()).layer(tower::service_fn(|d: Delivery| async move {
            let tx = d
                .extensions()
                .get::<MemoryTransaction>()
                .expect("the transaction");
            tx.record(format!("ship {}", String::from_utf8_lossy(d.body())));
            if &d.body()[..] == b"fail" {
                return Err::<(), BoxError>("failed after the write".into());
            }
            Ok(())
        }));
    for (id, body) in [("m1", "o-1"), ("m1", "o-1"), ("m2", "fail"), ("m3", "o-3")] {
        let d = Delivery::builder()
            .queue("q")
            .body(body)
            .properties(Properties {
                message_id: Some(id.into()),
                ..Properties::default()
            })
            .build();
        let _ = svc.ready().await.unwrap().call(d).await;
    }
    assert_eq!(store.committed_writes(), ["ship o-1", "ship o-3"]);
}
