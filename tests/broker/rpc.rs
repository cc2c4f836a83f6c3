//! Request/reply over direct reply-to: `RpcClient` as a tower service and
//! `Responder` on the serving side, against the real broker.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use acemq::rpc::{Responder, RpcClient, RpcError, RpcRequest};
use acemq::{App, BoxError, Delivery, Reject};
use futures::StreamExt;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use tower::{service_fn, Service, ServiceExt};

use crate::support::{self, plain_config, unique, Broker, QueueCleanup};

/// An app serving `queue`: the reply is the body upper-cased, after
/// `work`; every request body handled is counted.
async fn serve(
    queue: &str,
    work: Duration,
    concurrency: usize,
) -> (acemq::Running, Arc<AtomicUsize>) {
    let mut config = plain_config(queue);
    config.queues[0].concurrency = concurrency;
    config.queues[0].prefetch = (concurrency * 2) as u16;
    let handled = Arc::new(AtomicUsize::new(0));
    let app = App::new(config);
    let publisher = app.publisher();
    let count = handled.clone();
    let upper = service_fn(move |d: Delivery| {
        let count = count.clone();
        async move {
            tokio::time::sleep(work).await;
            count.fetch_add(1, Ordering::Relaxed);
            Ok::<_, BoxError>(d.body().to_ascii_uppercase())
        }
    });
    let running = app
        .consume(queue, Responder::new(publisher, upper))
        .start()
        .await
        .expect("the server starts");
    (running, handled)
}

async fn client(name: &str) -> (Arc<Connection>, RpcClient) {
    let conn = Connection::connect(
        &support::addr(),
        ConnectionProperties::default().with_connection_name(name.into()),
    )
    .await
    .expect("connect");
    let conn = Arc::new(conn);
    (conn.clone(), RpcClient::new(conn))
}

#[tokio::test]
async fn a_thousand_calls_with_eight_in_flight_are_each_answered_once() {
    let queue = unique("rpc-many");
    let _cleanup = QueueCleanup::new(support::all_queues(&queue));
    let (running, handled) = serve(&queue, Duration::ZERO, 8).await;
    let (_conn, client) = client(&unique("rpc-client")).await;

    let replies: Vec<(usize, Result<acemq::rpc::Reply, RpcError>)> =
        futures::stream::iter(0..1000usize)
            .map(|i| {
                let mut client = client.clone();
                let queue = queue.clone();
                async move {
                    let request = RpcRequest::new(
                        "",
                        queue.as_str(),
                        format!("call-{i}").into_bytes(),
                        Duration::from_secs(20),
                    );
                    let reply = async { client.ready().await?.call(request).await }.await;
                    (i, reply)
                }
            })
            .buffer_unordered(8)
            .collect()
            .await;
    let mut seen = HashSet::new();
    for (i, reply) in replies {
        let reply = reply.unwrap_or_else(|e| panic!("call {i}: {e}"));
        assert_eq!(reply.body(), format!("CALL-{i}").as_bytes(), "call {i}");
        assert!(seen.insert(i));
    }
    assert_eq!(seen.len(), 1000);
    assert_eq!(
        handled.load(Ordering::Relaxed),
        1000,
        "each request handled once"
    );
    assert_eq!(client.waiting(), 0);
    assert_eq!(client.late_replies(), 0, "no reply came twice or late");
    running.drain().await.expect("clean drain");
    Broker::new()
        .await
        .delete(&support::all_queues(&queue))
        .await;
}

#[tokio::test]
async fn a_call_nobody_answers_times_out_at_its_deadline_and_its_request_expires_in_the_queue() {
    let mut broker = Broker::new().await;
    let queue = unique("rpc-unanswered");
    let _cleanup = QueueCleanup::new(vec![queue.clone()]);
    broker
        .declare(&queue, FieldTable::default())
        .await
        .expect("declare");
    let (_conn, client) = client(&unique("rpc-client")).await;
    let started = Instant::now();
    let e = client
        .call(RpcRequest::new(
            "",
            queue.as_str(),
            b"anyone?".to_vec(),
            Duration::from_millis(400),
        ))
        .await
        .expect_err("no server");
    let took = started.elapsed();
    assert!(matches!(e, RpcError::Timeout { .. }), "{e:?}");
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(5),
        "ended after {took:?}"
    );
    assert_eq!(
        client.waiting(),
        0,
        "the timed-out call left nothing behind"
    );
    // The request carried its deadline as its expiration.
    assert!(
        broker.wait_ready(&queue, 0, Duration::from_secs(10)).await,
        "the request expired in the queue"
    );
    broker.delete(std::slice::from_ref(&queue)).await;
}

#[tokio::test]
async fn an_unroutable_call_fails_at_once_not_at_its_deadline() {
    let (_conn, client) = client(&unique("rpc-client")).await;
    let started = Instant::now();
    let e = client
        .call(RpcRequest::new(
            "",
            unique("rpc-nobody-home").as_str(),
            b"x".to_vec(),
            Duration::from_secs(30),
        ))
        .await
        .expect_err("no such queue");
    assert!(matches!(e, RpcError::Unroutable { .. }), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(client.waiting(), 0);
}

#[tokio::test]
async fn calls_in_flight_when_the_connection_is_closed_each_end_with_a_reply_or_a_typed_error() {
    let queue = unique("rpc-close");
    let _cleanup = QueueCleanup::new(support::all_queues(&queue));
    let (running, _handled) = serve(&queue, Duration::from_millis(1500), 4).await;
    let name = unique("rpc-closed-client");
    let (_conn, client) = client(&name).await;
    // One call first, so the client's channel and reply consumer exist.
    client
        .call(RpcRequest::new(
            "",
            queue.as_str(),
            b"warm".to_vec(),
            Duration::from_secs(10),
        ))
        .await
        .expect("a first reply");

    let outcomes = Arc::new(Mutex::new(Vec::new()));
    // 16 calls, 4 at a time, 1.5 s each: most still wait when the close
    // comes.
    let deadline = Duration::from_secs(12);
    let calls: Vec<_> = (0..16)
        .map(|i| {
            let client = client.clone();
            let queue = queue.clone();
            let outcomes = outcomes.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let r = client
                    .call(RpcRequest::new(
                        "",
                        queue.as_str(),
                        format!("c{i}").into_bytes(),
                        deadline,
                    ))
                    .await;
                outcomes
                    .lock()
                    .unwrap()
                    .push((r.map(|_| ()), started.elapsed()));
            })
        })
        .collect();
    // Close the client's connection from the broker while calls wait.
    assert!(
        support::eventually(Duration::from_secs(5), || async { client.waiting() > 0 }).await,
        "calls are waiting"
    );
    let listing = support::list_connections(&["pid", "client_properties"]).await;
    let pid = listing
        .lines()
        .find(|l| l.contains(&name))
        .and_then(|l| l.split('\t').next())
        .expect("the client's connection is listed")
        .to_owned();
    let out = support::rabbitmqctl()
        .args(["close_connection", &pid, "acemq test: closed during calls"])
        .output()
        .await
        .expect(support::RABBITMQCTL_RUNS);
    assert!(out.status.success());
    for c in calls {
        tokio::time::timeout(deadline + Duration::from_secs(5), c)
            .await
            .expect("no call hangs past its deadline")
            .expect("the call's task");
    }
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    assert_eq!(outcomes.len(), 16);
    let lost = outcomes
        .iter()
        .filter(|(r, _)| matches!(r, Err(RpcError::ConnectionLost { .. })))
        .count();
    assert!(lost > 0, "some calls were cut by the close: {outcomes:?}");
    for (r, took) in outcomes.iter() {
        assert!(
            matches!(
                r,
                Ok(()) | Err(RpcError::ConnectionLost { .. }) | Err(RpcError::Timeout { .. })
            ),
            "{r:?}"
        );
        assert!(*took <= deadline + Duration::from_secs(1), "{took:?}");
    }
    assert_eq!(client.waiting(), 0);
    running.drain().await.expect("clean drain");
    Broker::new()
        .await
        .delete(&support::all_queues(&queue))
        .await;
}

/// An app serving `queue` on `config` ([`App::serve`]) whose handler
/// does what the body asks: `reject` fails permanently, `fail` fails every
/// time (transient), anything else is upper-cased. Attempts are counted.
/// The queue opts in to the error text in its error replies.
async fn serve_failing(queue: &str, config: acemq::Config) -> (acemq::Running, Arc<AtomicUsize>) {
    let mut config = config;
    config.queues[0].reply_error_text = true;
    serve_failing_as_configured(queue, config).await
}

/// [`serve_failing`] with the config as it is.
async fn serve_failing_as_configured(
    queue: &str,
    config: acemq::Config,
) -> (acemq::Running, Arc<AtomicUsize>) {
    let attempts = Arc::new(AtomicUsize::new(0));
    let app = App::new(config);
    let count = attempts.clone();
    let handler = service_fn(move |d: Delivery| {
        count.fetch_add(1, Ordering::SeqCst);
        async move {
            match &d.body()[..] {
                b"reject" => Err::<Vec<u8>, BoxError>(Reject::new("not an order: no items").into()),
                b"fail" => Err("the payment service is down".into()),
                body => Ok(body.to_ascii_uppercase()),
            }
        }
    });
    let running = app
        .serve(queue, handler)
        .start()
        .await
        .expect("the server starts");
    (running, attempts)
}

/// Calls `body` on `queue` with a 30 s deadline; the error and how long
/// the call took.
async fn call_expecting_error(
    client: &RpcClient,
    queue: &str,
    body: &[u8],
) -> (RpcError, Duration) {
    let started = Instant::now();
    let e = client
        .call(RpcRequest::new(
            "",
            queue,
            body.to_vec(),
            Duration::from_secs(30),
        ))
        .await
        .expect_err("the request is dead-lettered");
    (e, started.elapsed())
}

/// Takes the request's copy from `{queue}.dlq` and returns its reason.
async fn reason_in_dlq(broker: &mut Broker, queue: &str) -> String {
    let copy = broker
        .get_within(&format!("{queue}.dlq"), Duration::from_secs(10))
        .await
        .expect("the request is in the dead-letter queue");
    let headers = support::message_headers(&copy.delivery.properties);
    headers
        .get("x-acemq-reason")
        .and_then(|v| v.as_str())
        .expect("the copy carries its reason")
        .to_owned()
}

#[tokio::test]
async fn a_request_its_handler_rejects_gets_a_rejected_reply_at_once_and_lands_in_the_dlq() {
    let queue = unique("rpc-reject");
    let _cleanup = QueueCleanup::new(support::all_queues(&queue));
    let (running, attempts) = serve_failing(&queue, support::ladder_config(&queue)).await;
    let (_conn, client) = client(&unique("rpc-client")).await;

    let (e, took) = call_expecting_error(&client, &queue, b"reject").await;
    let RpcError::Rejected { reason, detail, .. } = &e else {
        panic!("not a rejection: {e:?}");
    };
    assert_eq!(reason, "rejected");
    assert!(detail.contains("not an order: no items"), "{detail:?}");
    assert!(
        took < Duration::from_secs(10),
        "the rejection took {took:?}"
    );
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        1,
        "a permanent failure is not retried"
    );
    let mut broker = Broker::new().await;
    assert_eq!(reason_in_dlq(&mut broker, &queue).await, "rejected");

    // The same client still gets normal replies.
    let reply = client
        .call(RpcRequest::new(
            "",
            queue.as_str(),
            b"ok".to_vec(),
            Duration::from_secs(10),
        ))
        .await
        .expect("a normal reply");
    assert_eq!(reply.body(), b"OK");
    running.drain().await.expect("clean drain");
    assert_eq!(client.waiting(), 0);
    assert_eq!(client.late_replies(), 0, "one reply per request");
    broker.delete(&support::all_queues(&queue)).await;
}

#[tokio::test]
async fn a_request_that_exhausts_its_retries_gets_one_reply_the_rejection_after_its_last_attempt() {
    let queue = unique("rpc-exhaust");
    let _cleanup = QueueCleanup::new(support::all_queues(&queue));
    // Four attempts: one wait in process, then the 400 ms and 800 ms rungs.
    let (running, attempts) = serve_failing(&queue, support::ladder_config(&queue)).await;
    let (_conn, client) = client(&unique("rpc-client")).await;

    let (e, took) = call_expecting_error(&client, &queue, b"fail").await;
    let RpcError::Rejected { reason, detail, .. } = &e else {
        panic!("not a rejection: {e:?}");
    };
    assert_eq!(reason, "max-attempts");
    assert!(detail.contains("the payment service is down"), "{detail:?}");
    assert!(
        took < Duration::from_secs(15),
        "the rejection took {took:?} (deadline 30 s)"
    );
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        4,
        "every attempt ran before the reply"
    );
    let mut broker = Broker::new().await;
    assert_eq!(reason_in_dlq(&mut broker, &queue).await, "max-attempts");
    // Once the server has drained nothing more can be sent: the failed
    // attempts before the last sent no reply, so none came late.
    running.drain().await.expect("clean drain");
    assert_eq!(client.waiting(), 0);
    assert_eq!(client.late_replies(), 0, "exactly one reply: the rejection");
    broker.delete(&support::all_queues(&queue)).await;
}

#[tokio::test]
async fn a_rejected_request_on_a_queue_without_dead_lettering_still_gets_its_rejection() {
    let queue = unique("rpc-no-dlq");
    let _cleanup = QueueCleanup::new(support::all_queues(&queue));
    let mut config = support::plain_config(&queue);
    config.queues[0].dead_letter = false;
    let (running, attempts) = serve_failing(&queue, config).await;
    let (_conn, client) = client(&unique("rpc-client")).await;

    let (e, took) = call_expecting_error(&client, &queue, b"reject").await;
    assert!(
        matches!(&e, RpcError::Rejected { reason, .. } if reason == "rejected"),
        "{e:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "the rejection took {took:?}"
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    running.drain().await.expect("clean drain");
    assert_eq!(client.late_replies(), 0);
    Broker::new()
        .await
        .delete(&support::all_queues(&queue))
        .await;
}

#[tokio::test]
async fn a_client_without_confirms_gets_its_replies_and_an_unroutable_call_ends_at_its_deadline() {
    let queue = unique("rpc-unconfirmed");
    let _cleanup = QueueCleanup::new(support::all_queues(&queue));
    let (running, handled) = serve(&queue, Duration::ZERO, 4).await;
    let (_conn, client) = client(&unique("rpc-client")).await;
    let client = client.confirm_requests(false);
    for i in 0..20 {
        let reply = client
            .call(RpcRequest::new(
                "",
                queue.as_str(),
                format!("u{i}").into_bytes(),
                Duration::from_secs(10),
            ))
            .await
            .expect("a reply");
        assert_eq!(reply.body(), format!("U{i}").as_bytes());
    }
    assert_eq!(handled.load(Ordering::Relaxed), 20);
    let started = Instant::now();
    let e = client
        .call(RpcRequest::new(
            "",
            unique("rpc-nobody-home").as_str(),
            b"x".to_vec(),
            Duration::from_millis(400),
        ))
        .await
        .expect_err("no such queue");
    assert!(matches!(e, RpcError::Timeout { .. }), "{e:?}");
    assert!(started.elapsed() >= Duration::from_millis(400));
    assert_eq!(client.waiting(), 0);
    running.drain().await.expect("clean drain");
    Broker::new()
        .await
        .delete(&support::all_queues(&queue))
        .await;
}

#[tokio::test]
async fn an_error_reply_says_only_why_unless_the_queue_opts_in_to_the_error_text() {
    let queue = unique("rpc-generic");
    let _cleanup = QueueCleanup::new(support::all_queues(&queue));
    let (running, _) = serve_failing_as_configured(&queue, support::plain_config(&queue)).await;
    let (_conn, client) = client(&unique("rpc-client")).await;
    let (e, _) = call_expecting_error(&client, &queue, b"reject").await;
    let RpcError::Rejected { reason, detail, .. } = &e else {
        panic!("not a rejection: {e:?}");
    };
    assert_eq!(reason, "rejected");
    assert_eq!(detail, "the request could not be handled");
    running.drain().await.expect("clean drain");
}

/// Publishes a request-looking message to `queue` whose `reply_to` is
/// `victim` and whose body the handlers here reject.
async fn publish_with_reply_to(broker: &mut Broker, queue: &str, victim: &str) {
    let props = lapin::BasicProperties::default()
        .with_reply_to(victim.into())
        .with_correlation_id("c-1".into())
        .with_message_id("m-1".into());
    broker.publish_props(queue, b"reject", props).await;
}

#[tokio::test]
async fn a_failing_message_with_reply_to_publishes_nothing_there_unless_its_queue_serves_requests_and_allows_the_address(
) {
    let plain = unique("rpc-plain");
    let serving = unique("rpc-serving");
    let victim = unique("rpc-victim");
    let mut queues = support::all_queues(&plain);
    queues.extend(support::all_queues(&serving));
    queues.push(victim.clone());
    let _cleanup = QueueCleanup::new(queues.clone());
    let mut broker = Broker::new().await;
    broker
        .declare(&victim, FieldTable::default())
        .await
        .expect("the victim queue");

    // A plain queue (dead-lettering on), a handler that rejects.
    let mut config = support::plain_config(&plain);
    config.queues[0].dead_letter = true;
    let rejecting = service_fn(|_: Delivery| async move {
        Err::<(), BoxError>(Reject::new("secret: the card 4111 was declined").into())
    });
    let app = App::new(config)
        .consume(&plain, rejecting)
        .start()
        .await
        .expect("starts");
    publish_with_reply_to(&mut broker, &plain, &victim).await;
    assert!(
        broker
            .wait_ready(&format!("{plain}.dlq"), 1, Duration::from_secs(10))
            .await,
        "the message is dead-lettered"
    );
    app.drain().await.expect("clean drain");

    // A queue serving requests, the address neither direct reply-to nor
    // named in its config.
    let mut config = support::plain_config(&serving);
    config.queues[0].dead_letter = true;
    let (running, attempts) = serve_failing(&serving, config).await;
    publish_with_reply_to(&mut broker, &serving, &victim).await;
    assert!(
        broker
            .wait_ready(&format!("{serving}.dlq"), 1, Duration::from_secs(10))
            .await,
        "the request is dead-lettered"
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 1);
    running.drain().await.expect("clean drain");

    assert_eq!(
        broker.ready(&victim).await,
        Some(0),
        "nothing was published to the reply_to address"
    );
    broker.delete(&queues).await;
}

#[tokio::test]
async fn a_serving_queue_replies_to_an_address_its_config_names() {
    let queue = unique("rpc-named");
    let replies = unique("rpc-named-replies");
    let mut queues = support::all_queues(&queue);
    queues.push(replies.clone());
    let _cleanup = QueueCleanup::new(queues.clone());
    let mut broker = Broker::new().await;
    broker
        .declare(&replies, FieldTable::default())
        .await
        .expect("the replies queue");
    let mut config = support::plain_config(&queue);
    config.queues[0].reply_addresses = vec![replies.clone()];
    let (running, _) = serve_failing_as_configured(&queue, config).await;
    publish_with_reply_to(&mut broker, &queue, &replies).await;
    let reply = broker
        .get_within(&replies, Duration::from_secs(10))
        .await
        .expect("the error reply");
    let headers = support::message_headers(&reply.delivery.properties);
    assert_eq!(
        headers.get("x-acemq-reason").and_then(|v| v.as_str()),
        Some("rejected")
    );
    assert_eq!(
        &reply.delivery.data[..],
        b"the request could not be handled"
    );
    running.drain().await.expect("clean drain");
    broker.delete(&queues).await;
}

/// What the broker does with a reply whose caller has gone. acemq's replies
/// are not mandatory and its calls end at their own deadline, so nothing
/// rests on a `basic.return`: before RabbitMQ 4.2 a mandatory reply to a
/// caller that has gone came back as returned, from 4.2 it counts as
/// routed whether the caller is there or not (measured here on each
/// broker, with a mandatory publish of the test's own).
#[tokio::test]
async fn a_reply_to_a_caller_that_has_gone_is_dropped_the_request_acked_once_and_the_server_answers_the_next(
) {
    let queue = unique("rpc-gone");
    let _cleanup = QueueCleanup::new(support::all_queues(&queue));
    let (said, version) = crate::support::ctl_version().await;
    let (release, held) = tokio::sync::watch::channel(false);
    let handled = Arc::new(AtomicUsize::new(0));
    let reply_to = Arc::new(Mutex::new(None::<String>));
    let app = App::new(plain_config(&queue));
    let publisher = app.publisher();
    let (count, seen) = (handled.clone(), reply_to.clone());
    let upper = service_fn(move |d: Delivery| {
        let (count, seen, mut held) = (count.clone(), seen.clone(), held.clone());
        async move {
            if d.body().as_ref() == b"hold" {
                *seen.lock().unwrap() = d.properties().reply_to.clone();
                let _ = held.wait_for(|go| *go).await;
            }
            count.fetch_add(1, Ordering::SeqCst);
            Ok::<_, BoxError>(d.body().to_ascii_uppercase())
        }
    });
    let running = app
        .consume(&queue, Responder::new(publisher, upper))
        .start()
        .await
        .expect("the server starts");

    // The caller gives up at its deadline while the handler holds its
    // request, then goes away.
    let gone_name = unique("rpc-gone-client");
    let (_gone_conn, gone) = client(&gone_name).await;
    let started = Instant::now();
    let e = gone
        .call(RpcRequest::new(
            "",
            queue.as_str(),
            b"hold".to_vec(),
            Duration::from_secs(2),
        ))
        .await
        .expect_err("the handler holds the request past the deadline");
    assert!(matches!(e, RpcError::Timeout { .. }), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let address = reply_to
        .lock()
        .unwrap()
        .clone()
        .expect("the handler saw the request and its reply_to");
    support::close_connection_named(&gone_name, "the caller has gone").await;
    // The reply goes out to the address nobody consumes any more.
    release.send(true).expect("the handler waits");
    let mut broker = Broker::new().await;
    assert!(
        support::eventually(Duration::from_secs(20), || async {
            support::queue_counts(&queue).await == Some((0, 0))
        })
        .await,
        "the request was not acknowledged: {:?}",
        support::queue_counts(&queue).await
    );
    assert_eq!(
        handled.load(Ordering::SeqCst),
        1,
        "handled once, not retried"
    );
    assert_eq!(
        broker.ready(&format!("{queue}.dlq")).await.unwrap_or(0),
        0,
        "nothing dead-lettered"
    );

    // The server answers the next caller.
    let (_conn, next) = client(&unique("rpc-next-client")).await;
    let reply = next
        .call(RpcRequest::new(
            "",
            queue.as_str(),
            b"next".to_vec(),
            Duration::from_secs(20),
        ))
        .await
        .expect("the next call is answered");
    assert_eq!(reply.body(), b"NEXT");

    // What the broker says to a mandatory publish to the gone caller.
    let conn = support::connect().await;
    let ch = conn.create_channel().await.expect("a channel");
    ch.confirm_select(Default::default())
        .await
        .expect("confirms");
    let confirm = ch
        .basic_publish(
            "".into(),
            address.as_str().into(),
            lapin::options::BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            b"late",
            lapin::BasicProperties::default(),
        )
        .await
        .expect("published")
        .await
        .expect("confirmed");
    let returned = match &confirm {
        lapin::Confirmation::Ack(Some(r)) => Some(r.reply_code),
        _ => None,
    };
    println!(
        "RabbitMQ {said}: a mandatory publish to a caller that has gone: {}",
        returned.map_or("routed, no basic.return".to_owned(), |c| format!(
            "returned, {c}"
        ))
    );
    if version >= (4, 2) {
        assert_eq!(returned, None, "RabbitMQ {said} counts it as routed");
    } else {
        assert_eq!(
            returned,
            Some(312),
            "RabbitMQ {said} returns it as NO_ROUTE"
        );
    }
    assert!(ch.status().connected(), "the channel stays open");
    running.drain().await.expect("clean drain");
    broker.delete(&support::all_queues(&queue)).await;
}
