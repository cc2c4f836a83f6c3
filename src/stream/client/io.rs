//! The connection's two tasks. One reader parses frames in the order the
//! socket gives them and hands chunks out in that order (so with credit
//! over 1 chunks still arrive in stream order); one writer sends queued
//! frames and the heartbeat.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::state::{Response, State};
use crate::stream::error::{ResponseCode, StreamError};
use crate::stream::protocol::chunk;
use crate::stream::protocol::frame::{self, ServerFrame};
use crate::stream::types::StreamEvent;

/// How long one write may take before the connection is taken as lost.
const WRITE_BOUND: Duration = Duration::from_secs(10);

/// The most bytes a frame may have: `frame_max` (negotiated), except a
/// Deliver, which may have `chunk_max` — the broker sends a chunk whole,
/// whatever its size: RabbitMQ 3.10 sends chunks over the negotiated
/// `frame_max` (a 3 MB chunk on a 1 MiB connection, from an AMQP 0-9-1
/// publisher's batch).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) frame_max: u32,
    pub(crate) chunk_max: u32,
}

/// Reads one frame (without its size prefix). The size is checked against
/// `limits` (by the frame's key) before anything is allocated for it.
pub(crate) async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: Limits,
) -> Result<Bytes, StreamError> {
    let size = r.read_u32().await.map_err(io)?;
    if size == u32::from_be_bytes(*b"AMQP") {
        return Err(StreamError::Protocol(
            "the peer answered with AMQP 0-9-1's protocol header: this is the AMQP port, \
             not the stream port (5552 by default)"
                .into(),
        ));
    }
    if size < 4 {
        return Err(StreamError::Protocol(format!(
            "a frame of {size} bytes, under a key and version"
        )));
    }
    let mut head = [0u8; 4];
    r.read_exact(&mut head).await.map_err(io)?;
    let key = u16::from_be_bytes([head[0], head[1]]);
    if key == frame::DELIVER && size > limits.frame_max {
        if size > limits.chunk_max.max(limits.frame_max) {
            return Err(StreamError::ChunkTooLarge {
                size,
                max: limits.chunk_max,
            });
        }
    } else if size > limits.frame_max {
        return Err(StreamError::FrameTooLarge {
            size,
            max: limits.frame_max,
        });
    }
    let mut buf = BytesMut::zeroed(size as usize);
    buf[..4].copy_from_slice(&head);
    r.read_exact(&mut buf[4..]).await.map_err(io)?;
    Ok(buf.freeze())
}

/// Writes one frame within [`WRITE_BOUND`].
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    frame: &[u8],
) -> Result<(), StreamError> {
    match tokio::time::timeout(WRITE_BOUND, w.write_all(frame)).await {
        Ok(result) => result.map_err(io),
        Err(_) => Err(StreamError::Io(format!(
            "a write took over {WRITE_BOUND:?}"
        ))),
    }
}

pub(crate) fn io(e: std::io::Error) -> StreamError {
    StreamError::Io(e.to_string())
}

/// The reader: routes responses to their requests and everything else to
/// `events`, until the socket ends, a frame cannot be read, or the broker
/// is silent for `2 × heartbeat` (no bound when `heartbeat` is zero); then
/// the state's end sends the last event, [`StreamEvent::Closed`].
pub(crate) async fn reader<R: AsyncRead + Unpin>(
    mut r: R,
    state: Arc<State>,
    limits: Limits,
    heartbeat: Duration,
) {
    let why = loop {
        let next = read_frame(&mut r, limits);
        let bytes = if heartbeat.is_zero() {
            next.await
        } else {
            match tokio::time::timeout(heartbeat * 2, next).await {
                Ok(read) => read,
                Err(_) => {
                    break StreamError::HeartbeatTimeout {
                        silent: heartbeat * 2,
                    }
                }
            }
        };
        let decoded = bytes.and_then(frame::decode);
        let event = match decoded {
            Err(e) => break e,
            Ok(ServerFrame::Response { corr, code, body }) => {
                state.answer(corr, Response { code, body });
                continue;
            }
            Ok(ServerFrame::Deliver {
                subscription,
                chunk,
            }) => match chunk::parse(subscription, chunk) {
                Ok(c) => StreamEvent::Chunk(c),
                Err(e) => break e,
            },
            Ok(ServerFrame::CreditError { code, subscription }) => StreamEvent::CreditRefused {
                subscription,
                code: ResponseCode::from_u16(code),
            },
            Ok(ServerFrame::MetadataUpdate { code, stream }) => {
                StreamEvent::MetadataUpdate { stream, code }
            }
            Ok(ServerFrame::ConsumerUpdate {
                corr,
                subscription,
                active,
            }) => StreamEvent::ConsumerUpdate {
                subscription,
                correlation_id: corr,
                active,
            },
            Ok(ServerFrame::Close { corr, code, reason }) => {
                let _ = state.send(frame::ok_response(frame::CLOSE, corr));
                break StreamError::ClosedByBroker { code, reason };
            }
            Ok(ServerFrame::Heartbeat | ServerFrame::Tune { .. } | ServerFrame::Other { .. }) => {
                continue
            }
        };
        state.emit(event);
    };
    state.end(why);
}

/// The writer: sends queued frames in order, and a heartbeat every
/// `heartbeat` (none when zero), until the connection ends (the frames
/// queued before are written), the queue closes or a write fails; then it
/// shuts the socket's write side.
pub(crate) async fn writer<W: AsyncWrite + Unpin>(
    mut w: W,
    mut out: mpsc::UnboundedReceiver<Bytes>,
    state: Arc<State>,
    heartbeat: Duration,
) {
    let period = if heartbeat.is_zero() {
        Duration::from_secs(3600 * 24 * 365)
    } else {
        heartbeat
    };
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let frame = tokio::select! {
            next = out.recv() => match next {
                // Empty: the connection ended, everything before is written.
                Some(frame) if frame.is_empty() => break,
                Some(frame) => frame,
                None => break,
            },
            _ = tick.tick() => {
                if heartbeat.is_zero() {
                    continue;
                }
                frame::heartbeat()
            }
        };
        if let Err(e) = write_frame(&mut w, &frame).await {
            state.end(e);
            break;
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), w.shutdown()).await;
}
