//! A key that is a function of the delivery: per-key order by a field of
//! the body, and the key handed to the handler in the extensions.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use tower::{Service, ServiceBuilder, ServiceExt};

use super::{OrderedBy, PartitionLayer};
use crate::Delivery;

#[tokio::test]
async fn a_key_from_the_body_orders_equal_keys_and_reaches_the_handler_parsed_once() {
    use super::{KeyFn, OrderingKey};
    let parses = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = parses.clone();
    // The key: the body's text before ':'.
    let by_body = KeyFn::hashed("body prefix", move |d: &Delivery| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let text = std::str::from_utf8(d.body()).ok()?;
        Some(text.split_once(':')?.0.to_owned())
    });
    assert_eq!(
        OrderedBy::Fn(by_body.clone()),
        OrderedBy::Fn(by_body.clone())
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let mut svc = ServiceBuilder::new()
        .layer(PartitionLayer::new(OrderedBy::Fn(by_body)))
        .service_fn(move |d: Delivery| {
            let log = log.clone();
            async move {
                tokio::task::yield_now().await;
                let key = d.extensions().get::<OrderingKey<String>>().cloned();
                log.lock().unwrap().push((key, d.body().clone()));
                Ok::<_, Infallible>(())
            }
        });
    let body = |b: &'static str| Delivery::builder().body(b).build();
    let first = svc.ready().await.unwrap().call(body("ada:1"));
    let second = svc.ready().await.unwrap().call(body("ada:2"));
    let plain = svc.ready().await.unwrap().call(body("no key here"));
    let (b, a, c) = tokio::join!(second, first, plain);
    a.unwrap();
    b.unwrap();
    c.unwrap();
    let seen = seen.lock().unwrap();
    let ada = OrderingKey("ada".to_owned());
    // The keyless delivery ran at once, unordered, with no key noted; the
    // second of ada waited for the first.
    assert_eq!(
        *seen,
        [
            (Some(ada.clone()), bytes::Bytes::from("ada:1")),
            (None, bytes::Bytes::from("no key here")),
            (Some(ada), bytes::Bytes::from("ada:2")),
        ]
    );
    assert_eq!(
        parses.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "once each"
    );
}
