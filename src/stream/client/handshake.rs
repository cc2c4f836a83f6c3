//! The connection's opening: peer properties, SASL PLAIN, tune, open — in
//! order, on the socket alone, before the reader and writer start.

use std::time::Duration;

use tokio::net::TcpStream;

use super::io::{read_frame, write_frame, Limits};
use super::options::StreamOptions;
use crate::stream::error::{ResponseCode, StreamError};
use crate::stream::protocol::frame::{self, Request, ServerFrame};
use crate::stream::wire::Reader;

/// The largest frame asked for: 1 MiB.
pub(crate) const FRAME_MAX: u32 = 1024 * 1024;

/// The handshake's frames: no Deliver comes before Open.
const HANDSHAKE: Limits = Limits {
    frame_max: FRAME_MAX,
    chunk_max: FRAME_MAX,
};

/// What the opening settled.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) server_version: Option<String>,
    pub(crate) frame_max: u32,
    pub(crate) heartbeat: Duration,
    /// The next correlation id free.
    pub(crate) next_corr: u32,
}

/// Runs the opening on `socket`.
pub(crate) async fn open(
    socket: &mut TcpStream,
    opts: &StreamOptions,
) -> Result<Opened, StreamError> {
    let mut corr = 1;
    let props = vec![
        ("product".to_string(), "acemq".to_string()),
        ("version".to_string(), env!("CARGO_PKG_VERSION").to_string()),
        ("platform".to_string(), "Rust".to_string()),
        ("connection_name".to_string(), opts.connection_name.clone()),
    ];
    let (code, mut body) = call(socket, &mut corr, Request::PeerProperties(&props)).await?;
    expect_ok(code, "peer-properties")?;
    let peer = body.pairs("peer-properties").unwrap_or_default();
    let server_version = peer
        .into_iter()
        .find(|(k, _)| k == "version")
        .map(|(_, v)| v);

    let (code, mut body) = call(socket, &mut corr, Request::SaslHandshake).await?;
    expect_ok(code, "sasl-handshake")?;
    let n = body.count(2, "sasl-handshake").unwrap_or(0);
    let mechanisms: Vec<String> = (0..n)
        .filter_map(|_| body.string("sasl-handshake").ok())
        .collect();
    if !mechanisms.iter().any(|m| m == "PLAIN") {
        return Err(StreamError::Refused {
            what: format!("sasl-handshake (offered {mechanisms:?}, this client speaks PLAIN only)"),
            code: ResponseCode::SaslMechanismNotSupported,
        });
    }

    let plain = Request::SaslPlain {
        username: &opts.username,
        password: &opts.password,
    };
    let (code, _) = call(socket, &mut corr, plain).await?;
    match ResponseCode::from_u16(code) {
        ResponseCode::Ok => {}
        code @ (ResponseCode::AuthenticationFailure
        | ResponseCode::SaslAuthenticationFailureLoopback
        | ResponseCode::SaslError) => {
            return Err(StreamError::Authentication {
                username: opts.username.clone(),
                code,
            })
        }
        code => {
            return Err(StreamError::Refused {
                what: "sasl-authenticate".into(),
                code,
            })
        }
    }

    // The broker's Tune follows; the answer takes the lower of each value
    // (zero meaning "no limit" / "no heartbeat").
    let (server_frame_max, server_heartbeat) = loop {
        match frame::decode(read_frame(socket, HANDSHAKE).await?)? {
            ServerFrame::Tune {
                frame_max,
                heartbeat,
            } => break (frame_max, heartbeat),
            ServerFrame::Heartbeat => continue,
            other => {
                return Err(StreamError::Protocol(format!(
                    "{} where Tune was expected",
                    other.name()
                )))
            }
        }
    };
    let frame_max = lower(FRAME_MAX, server_frame_max);
    let ours = u32::try_from(opts.heartbeat.as_secs()).unwrap_or(u32::MAX);
    let heartbeat = lower(ours, server_heartbeat);
    write_frame(socket, &frame::tune_response(frame_max, heartbeat)).await?;

    let (code, _) = call(socket, &mut corr, Request::Open { vhost: &opts.vhost }).await?;
    match ResponseCode::from_u16(code) {
        ResponseCode::Ok => {}
        ResponseCode::VirtualHostAccessFailure => {
            return Err(StreamError::VirtualHost {
                username: opts.username.clone(),
                vhost: opts.vhost.clone(),
            })
        }
        code => {
            return Err(StreamError::Refused {
                what: "open".into(),
                code,
            })
        }
    }
    Ok(Opened {
        server_version,
        frame_max,
        heartbeat: Duration::from_secs(heartbeat.into()),
        next_corr: corr,
    })
}

/// The lower of two limits where zero means none.
fn lower(a: u32, b: u32) -> u32 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    }
}

fn expect_ok(code: u16, what: &str) -> Result<(), StreamError> {
    match ResponseCode::from_u16(code) {
        ResponseCode::Ok => Ok(()),
        code => Err(StreamError::Refused {
            what: what.into(),
            code,
        }),
    }
}

/// Sends `req` and reads frames until its response.
async fn call(
    socket: &mut TcpStream,
    corr: &mut u32,
    req: Request<'_>,
) -> Result<(u16, Reader), StreamError> {
    let mine = *corr;
    *corr += 1;
    write_frame(socket, &req.encode(mine)?).await?;
    loop {
        match frame::decode(read_frame(socket, HANDSHAKE).await?)? {
            ServerFrame::Response {
                corr, code, body, ..
            } if corr == mine => return Ok((code, body)),
            ServerFrame::Close { code, reason, .. } => {
                return Err(StreamError::ClosedByBroker { code, reason })
            }
            ServerFrame::Heartbeat => continue,
            other => {
                return Err(StreamError::Protocol(format!(
                    "{} where the answer to {} was expected",
                    other.name(),
                    req.name()
                )))
            }
        }
    }
}
