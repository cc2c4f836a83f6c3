//! The calling side: a `tower::Service` over direct reply-to.

use crate::sync::Locked;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use acemq_layers::dead_letter::{ERROR_HEADER, REASON_HEADER};
use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use tokio::sync::oneshot;
use tracing::{debug, warn};

use super::call::{Reply, RpcError, RpcRequest, REPLY_TO};
use crate::connection::Live;
use crate::publisher::Publisher;

type Pending = HashMap<String, oneshot::Sender<Result<Reply, RpcError>>>;

/// A request/reply client over RabbitMQ's direct reply-to: a
/// [`tower::Service`] from [`RpcRequest`] to [`Reply`], so tower's timeouts,
/// retries, rate limits and load-shedding apply to calls as they do to HTTP
/// (an example is in the [module docs](crate::rpc)).
///
/// Cheap to clone; clones share one channel, one reply consumer and the
/// table of calls waiting for their reply.
///
/// Example: the [module docs](crate::rpc); runnable: `examples/rpc.rs`.
#[derive(Clone)]
pub struct RpcClient {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Live,
    /// How long a call waits for a connection.
    wait: Duration,
    /// The channel that publishes requests and consumes their replies
    /// (behind an `Arc`: a call takes one reference, not a clone of each of
    /// lapin's handles).
    channel: Mutex<Option<Arc<Channel>>>,
    /// Held while a channel is opened, so calls open one, not one each.
    opening: tokio::sync::Mutex<()>,
    pending: Arc<Mutex<Pending>>,
    next_id: AtomicU64,
    prefix: String,
    late: Arc<AtomicU64>,
    /// Requests published mandatory with a confirm awaited.
    confirm: bool,
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcClient")
            .field("waiting", &self.waiting())
            .field("late_replies", &self.late_replies())
            .finish_non_exhaustive()
    }
}

impl RpcClient {
    /// A client on `connection` (for a client outside an [`App`](crate::App);
    /// in one, [`App::rpc_client`](crate::App::rpc_client) shares the
    /// publishing connection and follows its reconnects).
    pub fn new(connection: Arc<Connection>) -> Self {
        RpcClient::on(
            Live::fixed(connection),
            crate::config::Config::DEFAULT_CONNECT_TIMEOUT,
        )
    }

    /// A client whose connection the runner provides (and replaces after a
    /// reconnect).
    pub(crate) fn on(connection: Live, wait: Duration) -> Self {
        RpcClient {
            inner: Arc::new(Inner {
                connection,
                wait,
                channel: Mutex::new(None),
                opening: tokio::sync::Mutex::new(()),
                pending: Arc::new(Mutex::new(HashMap::new())),
                next_id: AtomicU64::new(1),
                prefix: format!("acemq-rpc-{:x}-", fastrand::u64(..)),
                late: Arc::new(AtomicU64::new(0)),
                confirm: true,
            }),
        }
    }

    /// Whether requests are published **mandatory with a confirm** (the
    /// default, `true`): an unroutable request fails at once with
    /// [`RpcError::Unroutable`], one the broker refuses with
    /// [`RpcError::ConnectionLost`]. With `false` a request is published
    /// without a confirm and not mandatory: one frame less each way per
    /// call and no wait for the confirm (`benches/rpc.rs` measures both),
    /// but a request no queue takes is dropped by the broker and its call
    /// ends at its deadline with [`RpcError::Timeout`].
    ///
    /// Set it on a client before its first call; clones made before keep
    /// the setting they had (the result shares nothing with them).
    pub fn confirm_requests(self, on: bool) -> Self {
        if self.inner.confirm == on {
            return self;
        }
        let wait = self.inner.wait;
        let connection = self.inner.connection.clone();
        let mut fresh = RpcClient::on(connection, wait);
        Arc::get_mut(&mut fresh.inner)
            .expect("a client just built is not shared")
            .confirm = on;
        fresh
    }

    /// Calls waiting for their reply.
    pub fn waiting(&self) -> usize {
        self.inner.pending.locked().len()
    }

    /// Replies that arrived after their call had ended (timed out or
    /// cancelled), dropped.
    pub fn late_replies(&self) -> u64 {
        self.inner.late.load(Ordering::Relaxed)
    }

    /// Sends `request` and waits for its reply, at most its deadline.
    pub async fn call(&self, request: RpcRequest) -> Result<Reply, RpcError> {
        let deadline = request.timeout;
        let id = format!(
            "{}{}",
            self.inner.prefix,
            self.inner.next_id.fetch_add(1, Ordering::Relaxed)
        );
        let (tx, rx) = oneshot::channel();
        let mut guard = PendingGuard {
            pending: &self.inner.pending,
            id: &id,
            answered: false,
        };
        let answered = &mut guard.answered;
        // One timer for the whole call: the send and the wait for the reply.
        let call = async {
            let channel = self.channel().await?;
            self.inner.pending.locked().insert(id.clone(), tx);
            publish(&channel, &request, &id, self.inner.confirm).await?;
            let reply = rx.await;
            // The reply router took the entry out (to answer, or to fail
            // every waiting call).
            *answered = true;
            match reply {
                Ok(reply) => reply,
                Err(_) => Err(RpcError::ConnectionLost {
                    message: "the reply consumer ended before the reply came".to_owned(),
                }),
            }
        };
        let result = tokio::time::timeout(deadline, call)
            .await
            .unwrap_or(Err(RpcError::Timeout { after: deadline }));
        drop(guard);
        result
    }

    /// The live channel, opening one (with its reply consumer) when there
    /// is none or it closed.
    async fn channel(&self) -> Result<Arc<Channel>, RpcError> {
        if let Some(ch) = self.live_channel() {
            return Ok(ch);
        }
        let _opening = self.inner.opening.lock().await;
        if let Some(ch) = self.live_channel() {
            return Ok(ch);
        }
        let conn = self.connection().await?;
        let channel = open(&conn, self.inner.confirm).await.map_err(transport)?;
        let consumer = channel
            .basic_consume(
                REPLY_TO.into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(transport)?;
        tokio::spawn(route_replies(
            consumer,
            self.inner.pending.clone(),
            self.inner.late.clone(),
        ));
        let channel = Arc::new(channel);
        *self.inner.channel.locked() = Some(channel.clone());
        Ok(channel)
    }

    /// The channel, if it is open.
    fn live_channel(&self) -> Option<Arc<Channel>> {
        self.inner
            .channel
            .locked()
            .as_ref()
            .filter(|ch| ch.status().connected())
            .cloned()
    }

    async fn connection(&self) -> Result<Arc<Connection>, RpcError> {
        match tokio::time::timeout(self.inner.wait, self.inner.connection.wait()).await {
            Ok(Some(c)) => Ok(c),
            _ => Err(RpcError::ConnectionLost {
                message: format!(
                    "no open connection to call on (not started yet, reconnecting, or closed); waited {:?}",
                    self.inner.wait
                ),
            }),
        }
    }
}

/// Removes a call's entry however the call ends (timeout, an error, or the
/// caller dropping the future), so a late reply finds nothing and is
/// counted; nothing to do once the reply router has taken it out.
struct PendingGuard<'a> {
    pending: &'a Mutex<Pending>,
    id: &'a str,
    answered: bool,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.pending.locked().remove(self.id);
        }
    }
}

async fn open(conn: &Connection, confirm: bool) -> lapin::Result<Channel> {
    let ch = conn.create_channel().await?;
    if confirm {
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
    }
    Ok(ch)
}

fn transport(e: lapin::Error) -> RpcError {
    RpcError::ConnectionLost {
        message: e.to_string(),
    }
}

/// Publishes the request; with `confirm`, mandatory and its confirm
/// awaited (without, lapin resolves the confirm as not requested: a
/// mandatory return would have nowhere to go, so it is not mandatory).
async fn publish(
    channel: &Channel,
    request: &RpcRequest,
    id: &str,
    confirm: bool,
) -> Result<(), RpcError> {
    let target = || {
        if request.exchange.is_empty() {
            request.routing_key.clone()
        } else {
            format!("{}/{}", request.exchange, request.routing_key)
        }
    };
    let ms = request.timeout.as_millis().max(1);
    let properties: BasicProperties = request
        .properties
        .clone()
        .with_correlation_id(id.into())
        .with_reply_to(REPLY_TO.into())
        .with_expiration(ms.to_string().into());
    let confirm = channel
        .basic_publish(
            request.exchange.as_str().into(),
            request.routing_key.as_str().into(),
            BasicPublishOptions {
                mandatory: confirm,
                ..BasicPublishOptions::default()
            },
            &request.body,
            properties,
        )
        .await
        .map_err(transport)?
        .await
        .map_err(transport)?;
    match confirm {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_)) => {
            Err(RpcError::Unroutable { target: target() })
        }
        Confirmation::Nack(None) => Err(RpcError::ConnectionLost {
            message: format!(
                "the broker refused the request to {} (a negative confirm)",
                target()
            ),
        }),
    }
}

/// Hands each reply to its call; when the consumer ends (channel or
/// connection lost) every waiting call fails at once.
async fn route_replies(
    mut consumer: lapin::Consumer,
    pending: Arc<Mutex<Pending>>,
    late: Arc<AtomicU64>,
) {
    while let Some(item) = consumer.next().await {
        let delivery = match item {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %e, "the reply consumer was lost; calls waiting fail");
                break;
            }
        };
        let Some(id) = delivery.properties.correlation_id().as_ref() else {
            late.fetch_add(1, Ordering::Relaxed);
            debug!("a reply without a correlation id, dropped");
            continue;
        };
        let tx = pending.locked().remove(id.as_str());
        match tx {
            Some(tx) => {
                let _ = tx.send(match rejection(&delivery) {
                    Some(e) => Err(e),
                    None => Ok(Reply::from_delivery(delivery)),
                });
            }
            None => {
                late.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("acemq.rpc.late_replies").increment(1);
                debug!(
                    correlation_id = id.as_str(),
                    "a reply after its call ended, dropped"
                );
            }
        }
    }
    let waiting: Vec<_> = pending.locked().drain().collect();
    for (_, tx) in waiting {
        let _ = tx.send(Err(RpcError::ConnectionLost {
            message: "the connection or channel was lost while the call waited for its reply; it may or may not have been handled".to_owned(),
        }));
    }
}

/// The error an error reply carries (one with the `x-acemq-reason`
/// header); `None` for a normal reply.
fn rejection(delivery: &lapin::message::Delivery) -> Option<RpcError> {
    let headers = delivery.properties.headers().as_ref()?.inner();
    let text = |name: &str| match headers.get(name)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    };
    let reason = text(REASON_HEADER)?;
    let detail =
        text(ERROR_HEADER).unwrap_or_else(|| String::from_utf8_lossy(&delivery.data).into_owned());
    Some(RpcError::Rejected { reason, detail })
}

impl tower::Service<RpcRequest> for RpcClient {
    type Response = Reply;
    type Error = RpcError;
    type Future = Pin<Box<dyn Future<Output = Result<Reply, RpcError>> + Send + 'static>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), RpcError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: RpcRequest) -> Self::Future {
        let client = self.clone();
        Box::pin(async move { client.call(request).await })
    }
}

// The publisher's one method outside its room: request/reply is built on
// the publisher, which knows nothing of it.
impl Publisher {
    /// A request/reply client on the publishing connection (it follows the
    /// reconnects). See [`crate::rpc`].
    pub fn rpc_client(&self) -> RpcClient {
        let (connection, wait) = self.connection_watch();
        RpcClient::on(connection, wait)
    }
}
