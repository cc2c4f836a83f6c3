//! [`StreamClient`]: one connection to the stream plugin, its requests and
//! its events.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::handshake;
use super::io::{reader, writer, Limits};
use super::options::StreamOptions;
use super::state::{Response, State};
use crate::connection::CLOSE_BOUND;
use crate::stream::error::{ResponseCode, StreamError};
use crate::stream::protocol::frame::{self, Request};
use crate::stream::types::{OffsetSpec, StreamEvent, StreamMetadata, StreamStats};

/// How long a request waits for the broker's answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One connection to RabbitMQ's stream plugin (consuming side).
///
/// Cheap to clone (one `Arc`); the connection ends when
/// [`close`](Self::close) is called or the last clone is dropped. Its
/// events ([`StreamEvent`]) come on the receiver [`connect`](Self::connect)
/// returns, in the order the socket delivered them: one reader task parses
/// every frame in order, so with credit over 1 chunks still arrive in
/// offset order.
///
/// The event channel is unbounded: what it can hold is bounded by credit —
/// the broker sends a subscription no more chunks than the credit it was
/// given, so a consumer holds at most `credit × chunk size` per
/// subscription until it credits again.
#[derive(Clone, Debug)]
pub struct StreamClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Arc<State>,
    server_version: Option<String>,
    tasks: [AbortHandle; 2],
}

/// The last handle gone: the connection ends (its events end with
/// `Closed`), without waiting for the broker.
impl Drop for Inner {
    fn drop(&mut self) {
        self.state.closing();
        self.state.end(StreamError::Closed);
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl StreamClient {
    /// Connects (TCP with `TCP_NODELAY`, then the handshake), all within
    /// `opts.connect_timeout`; the client and its events.
    pub async fn connect(
        opts: &StreamOptions,
    ) -> Result<(StreamClient, mpsc::UnboundedReceiver<StreamEvent>), StreamError> {
        let addr = format!("{}:{}", opts.host, opts.port);
        let bound = opts.connect_timeout;
        let connected = tokio::time::timeout(bound, async {
            let mut socket = TcpStream::connect((opts.host.as_str(), opts.port))
                .await
                .map_err(|e| StreamError::Unreachable {
                    addr: addr.clone(),
                    reason: e.to_string(),
                })?;
            socket.set_nodelay(true).map_err(super::io::io)?;
            let opened = handshake::open(&mut socket, opts).await?;
            Ok::<_, StreamError>((socket, opened))
        })
        .await
        .map_err(|_| StreamError::ConnectTimeout {
            addr: addr.clone(),
            bound,
        })?;
        let (socket, opened) = connected?;
        let (read_half, write_half) = socket.into_split();
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let state = Arc::new(State::new(out_tx, events_tx, opened.next_corr));
        let read = tokio::spawn(reader(
            read_half,
            state.clone(),
            Limits {
                frame_max: opened.frame_max,
                chunk_max: opts.max_chunk_bytes,
            },
            opened.heartbeat,
        ));
        let write = tokio::spawn(writer(write_half, out_rx, state.clone(), opened.heartbeat));
        let inner = Inner {
            state,
            server_version: opened.server_version,
            tasks: [read.abort_handle(), write.abort_handle()],
        };
        Ok((
            StreamClient {
                inner: Arc::new(inner),
            },
            events_rx,
        ))
    }

    /// The broker's version, from its peer properties (`3.10.8`).
    pub fn server_version(&self) -> Option<&str> {
        self.inner.server_version.as_deref()
    }

    async fn request(&self, req: Request<'_>) -> Result<Response, StreamError> {
        let state = &self.inner.state;
        if let Some(e) = state.ended() {
            return Err(e);
        }
        let (corr, rx) = state.register();
        let sent = req.encode(corr).and_then(|f| state.send(f));
        if let Err(e) = sent {
            state.forget(corr);
            return Err(e);
        }
        match tokio::time::timeout(REQUEST_TIMEOUT, rx).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(_)) => Err(state.ended().unwrap_or(StreamError::Closed)),
            Err(_) => {
                state.forget(corr);
                Err(StreamError::RequestTimeout {
                    what: req.name(),
                    bound: REQUEST_TIMEOUT,
                })
            }
        }
    }

    /// Subscribes `id` to `stream` from `offset` with `credit` chunks; the
    /// chunks come as [`StreamEvent::Chunk`]. `properties` go to the broker
    /// as they are (`single-active-consumer`, `name`, `super-stream`, ...).
    pub async fn subscribe(
        &self,
        id: u8,
        stream: &str,
        offset: OffsetSpec,
        credit: u16,
        properties: &[(String, String)],
    ) -> Result<(), StreamError> {
        let req = Request::Subscribe {
            id,
            stream,
            offset,
            credit,
            properties,
        };
        let code = self.request(req).await?.code;
        check(code, "subscribe", stream, id)
    }

    /// Gives `credit` more chunks to subscription `id`. The broker answers
    /// only a refusal ([`StreamEvent::CreditRefused`]).
    pub fn credit(&self, id: u8, credit: u16) -> Result<(), StreamError> {
        self.inner.state.send(frame::credit(id, credit))
    }

    /// Ends subscription `id`.
    pub async fn unsubscribe(&self, id: u8) -> Result<(), StreamError> {
        let code = self.request(Request::Unsubscribe { id }).await?.code;
        check(code, "unsubscribe", "", id)
    }

    /// Stores `offset` for `reference` on `stream`. The broker does not
    /// answer, and stores it asynchronously: a
    /// [`query_offset`](Self::query_offset) right after may not see it yet.
    pub fn store_offset(
        &self,
        reference: &str,
        stream: &str,
        offset: u64,
    ) -> Result<(), StreamError> {
        let frame = frame::store_offset(reference, stream, offset)
            .ok_or_else(|| StreamError::Invalid("store-offset: a name over 32,767 bytes".into()))?;
        self.inner.state.send(frame)
    }

    /// The offset stored for `reference` on `stream`; `None` when none is.
    pub async fn query_offset(
        &self,
        reference: &str,
        stream: &str,
    ) -> Result<Option<u64>, StreamError> {
        let mut response = self
            .request(Request::QueryOffset { reference, stream })
            .await?;
        if ResponseCode::from_u16(response.code) == ResponseCode::NoOffset {
            return Ok(None);
        }
        check(response.code, "query-offset", stream, 0)?;
        let offset = response.body.u64("query-offset").map_err(short)?;
        Ok(Some(offset))
    }

    /// Answers the broker's [`StreamEvent::ConsumerUpdate`]: the
    /// subscription starts from `offset` when it became active.
    pub async fn answer_consumer_update(
        &self,
        correlation_id: u32,
        offset: OffsetSpec,
    ) -> Result<(), StreamError> {
        self.inner
            .state
            .send(frame::consumer_update_response(correlation_id, offset))
    }

    /// The partitions (streams) of `super_stream`, in order. Super
    /// streams came with RabbitMQ 3.11: on an older broker (or one whose
    /// version is unknown) this is [`StreamError::Unsupported`] without
    /// asking (3.10 leaves the command unanswered).
    pub async fn partitions(&self, super_stream: &str) -> Result<Vec<String>, StreamError> {
        if !self.at_least_3_11() {
            return Err(StreamError::Unsupported {
                what: "partitions (super streams)",
                needs: "3.11",
                version: self.server_version().unwrap_or("unknown").to_string(),
            });
        }
        let mut response = self.request(Request::Partitions { super_stream }).await?;
        check(response.code, "partitions", super_stream, 0)?;
        let b = &mut response.body;
        let n = b.count(2, "partitions").map_err(short)?;
        (0..n)
            .map(|_| b.string("partitions").map_err(short))
            .collect()
    }

    /// Where each of `streams` lives.
    pub async fn metadata(&self, streams: &[&str]) -> Result<Vec<StreamMetadata>, StreamError> {
        let response = self.request(Request::Metadata { streams }).await?;
        super::metadata::parse(response.body).map_err(short)
    }

    /// `stream`'s statistics; `Ok(None)` on a broker older than 3.11 (it
    /// does not know the command) or whose version is unknown.
    pub async fn stream_stats(&self, stream: &str) -> Result<Option<StreamStats>, StreamError> {
        if !self.at_least_3_11() {
            return Ok(None);
        }
        let mut response = self.request(Request::StreamStats { stream }).await?;
        check(response.code, "stream-stats", stream, 0)?;
        let pairs = super::metadata::stats(&mut response.body).map_err(short)?;
        let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
        Ok(Some(StreamStats {
            first_offset: get("first_chunk_id"),
            committed_chunk_id: get("committed_chunk_id"),
            all: pairs,
        }))
    }

    /// Whether the broker is RabbitMQ 3.11 or later (super streams, stream
    /// statistics, single active consumer).
    fn at_least_3_11(&self) -> bool {
        let Some(v) = self.server_version() else {
            return false;
        };
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let major = parts.next().unwrap_or(0);
        let minor = parts.next().unwrap_or(0);
        (major, minor) >= (3, 11)
    }

    /// Closes the connection, waiting at most one second for the broker's
    /// answer. Closing a closed connection does nothing.
    pub async fn close(&self) -> Result<(), StreamError> {
        let state = &self.inner.state;
        if state.ended().is_some() {
            return Ok(());
        }
        state.closing();
        let (corr, rx) = state.register();
        let req = Request::Close {
            code: 1,
            reason: "closed by the application",
        };
        let sent = req.encode(corr).and_then(|f| state.send(f));
        let answered = sent.is_ok()
            && tokio::time::timeout(CLOSE_BOUND, rx)
                .await
                .is_ok_and(|r| r.is_ok());
        state.end(StreamError::Closed);
        for task in &self.inner.tasks {
            task.abort();
        }
        if answered {
            Ok(())
        } else {
            Err(StreamError::RequestTimeout {
                what: "close",
                bound: CLOSE_BOUND,
            })
        }
    }
}

fn short(s: crate::stream::wire::Short) -> StreamError {
    StreamError::Protocol(format!("a response cut short in {}", s.0))
}

/// A response code as the request's result.
fn check(code: u16, what: &str, stream: &str, id: u8) -> Result<(), StreamError> {
    let stream = stream.to_string();
    Err(match ResponseCode::from_u16(code) {
        ResponseCode::Ok => return Ok(()),
        ResponseCode::StreamDoesNotExist => StreamError::StreamDoesNotExist { stream },
        ResponseCode::StreamNotAvailable => StreamError::StreamNotAvailable { stream },
        ResponseCode::SubscriptionIdAlreadyExists => StreamError::SubscriptionIdInUse { id },
        ResponseCode::SubscriptionIdDoesNotExist => StreamError::UnknownSubscription { id },
        ResponseCode::AccessRefused => StreamError::AccessRefused {
            what: format!("{what} on {stream:?}"),
        },
        code => StreamError::Refused {
            what: format!("{what} on {stream:?}"),
            code,
        },
    })
}
