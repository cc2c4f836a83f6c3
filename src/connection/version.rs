//! The broker's version, read at connect.
//!
//! lapin keeps nothing of `connection.start`'s server properties, so acemq
//! reads them over a short connection of its own: the AMQP 0-9-1 handshake
//! to the end (`start-ok` with PLAIN and the address's user, `tune-ok`,
//! `open` of the address's vhost), then `connection.close`, answered by
//! `close-ok`. The broker logs it as any client's ordinary connection and
//! close; a client that hangs up earlier is logged as a warning ("client
//! unexpectedly closed TCP connection"), and a `connection.close` before
//! `start-ok` as an error (measured on RabbitMQ 3.10.8 and 4.3.6). Plain
//! `amqp://` only: over `amqps://` the version stays unknown.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use lapin::protocol::{connection::AMQPMethod, parse_class, AMQPClass};
use lapin::types::AMQPValue;
use lapin::uri::{AMQPScheme, AMQPUri};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the broker says it is in `connection.start`: its `product` and
/// `version` server properties.
///
/// ```
/// use acemq::connection::BrokerVersion;
///
/// let v = BrokerVersion::new("RabbitMQ", "4.3.6");
/// assert_eq!(v.numbers(), Some((4, 3, 6)));
/// assert!(v.at_least(4, 3) && !v.at_least(4, 4));
/// assert_eq!(v.to_string(), "RabbitMQ 4.3.6");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerVersion {
    /// `product`, e.g. `RabbitMQ`.
    pub product: String,
    /// `version`, e.g. `4.3.6`.
    pub version: String,
}

impl BrokerVersion {
    /// A version from its two properties.
    pub fn new(product: impl Into<String>, version: impl Into<String>) -> Self {
        BrokerVersion {
            product: product.into(),
            version: version.into(),
        }
    }

    /// Major, minor and patch: the leading digits of the version's first
    /// three dot-separated parts (`4.3.0-rc.1` is 4.3.0; a missing patch
    /// is 0). `None` when the first two have no digits.
    pub fn numbers(&self) -> Option<(u32, u32, u32)> {
        let mut parts = self.version.split('.').map(|p| {
            let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok()
        });
        let major = parts.next()??;
        let minor = parts.next()??;
        let patch = parts.next().flatten().unwrap_or(0);
        Some((major, minor, patch))
    }

    /// The version is `major.minor` or later; false when it cannot be read.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        self.numbers()
            .is_some_and(|(a, b, _)| (a, b) >= (major, minor))
    }
}

impl fmt::Display for BrokerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.product, self.version)
    }
}

/// The largest frame read before `connection.tune` (the broker's
/// `connection.start` is about 500 bytes).
const MAX_FRAME: u32 = 128 * 1024;

/// Reads the version of the broker at `addr` within `timeout`, over a
/// connection named `name`. `Err` says why it is unknown (an `amqps://`
/// address, a broker that did not answer). Once `connection.start` is read
/// the version is returned, even if the rest of the handshake fails (that
/// is logged at debug).
pub(crate) async fn read_broker_version(
    addr: &str,
    name: &str,
    timeout: Duration,
) -> Result<BrokerVersion, String> {
    let uri = AMQPUri::from_str(addr).map_err(|e| format!("the address cannot be read: {e}"))?;
    if uri.scheme == AMQPScheme::AMQPS {
        return Err("not read over amqps://".to_owned());
    }
    let mut stream = tokio::time::timeout(timeout, async {
        TcpStream::connect((uri.authority.host.as_str(), uri.authority.port)).await
    })
    .await
    .map_err(|_| format!("no connection within {timeout:?}"))?
    .map_err(|e| format!("cannot connect: {e}"))?;
    let mut version = None;
    let talk = handshake(&mut stream, &uri, name, &mut version);
    let done = tokio::time::timeout(timeout, talk).await;
    match (version, done) {
        (Some(v), Ok(Ok(()))) => Ok(v),
        (Some(v), Ok(Err(e))) => {
            tracing::debug!("the version check's handshake ended early: {e}");
            Ok(v)
        }
        (Some(v), Err(_)) => {
            tracing::debug!("the version check's handshake took over {timeout:?}");
            Ok(v)
        }
        (None, Ok(Err(e))) => Err(e),
        (None, _) => Err(format!("no connection.start within {timeout:?}")),
    }
}

/// The whole handshake and close; `version` is set as soon as
/// `connection.start` is read.
async fn handshake(
    s: &mut TcpStream,
    uri: &AMQPUri,
    name: &str,
    version: &mut Option<BrokerVersion>,
) -> Result<(), String> {
    let io = |e: std::io::Error| e.to_string();
    s.write_all(b"AMQP\x00\x00\x09\x01").await.map_err(io)?;
    let AMQPMethod::Start(start) = read_method(s).await? else {
        return Err("the broker's first method is not connection.start".to_owned());
    };
    *version = Some(version_of(&start.server_properties));
    let user = &uri.authority.userinfo;
    s.write_all(&start_ok(name, &user.username, &user.password))
        .await
        .map_err(io)?;
    let tune = match read_method(s).await? {
        AMQPMethod::Tune(t) => t,
        AMQPMethod::Close(c) => return Err(refused(s, "start-ok", &c).await),
        _ => return Err("no connection.tune after start-ok".to_owned()),
    };
    s.write_all(&tune_ok(tune.channel_max, tune.frame_max))
        .await
        .map_err(io)?;
    s.write_all(&open(&uri.vhost)).await.map_err(io)?;
    match read_method(s).await? {
        AMQPMethod::OpenOk(_) => {}
        AMQPMethod::Close(c) => return Err(refused(s, "open", &c).await),
        _ => return Err("no connection.open-ok after open".to_owned()),
    }
    s.write_all(&close()).await.map_err(io)?;
    match read_method(s).await? {
        AMQPMethod::CloseOk(_) => Ok(()),
        _ => Err("no connection.close-ok after close".to_owned()),
    }
}

/// Answers the broker's `connection.close` with `close-ok`; says why.
async fn refused(s: &mut TcpStream, after: &str, c: &lapin::protocol::connection::Close) -> String {
    let _ = s.write_all(&method(10, 51, &[])).await;
    format!(
        "the broker closed the connection after {after}: {} {}",
        c.reply_code, c.reply_text
    )
}

/// `product` and `version` from `connection.start`'s server properties
/// (`?` for one missing).
fn version_of(props: &lapin::types::FieldTable) -> BrokerVersion {
    let text = |key: &str| match props.inner().get(key) {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        Some(AMQPValue::ShortString(s)) => s.as_str().to_owned(),
        _ => "?".to_owned(),
    };
    BrokerVersion::new(text("product"), text("version"))
}

/// The next connection-class method on channel 0 (heartbeats skipped).
async fn read_method(s: &mut TcpStream) -> Result<AMQPMethod, String> {
    loop {
        let mut head = [0u8; 7];
        s.read_exact(&mut head).await.map_err(|e| e.to_string())?;
        let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]);
        if size > MAX_FRAME {
            return Err(format!("a frame of {size} bytes"));
        }
        let mut payload = vec![0u8; size as usize + 1];
        s.read_exact(&mut payload)
            .await
            .map_err(|e| e.to_string())?;
        payload.pop();
        if let Some(m) = decode(head[0], &payload)? {
            return Ok(m);
        }
    }
}

/// A frame's payload as a connection method; `None` for a heartbeat.
fn decode(kind: u8, payload: &[u8]) -> Result<Option<AMQPMethod>, String> {
    match kind {
        8 => Ok(None),
        1 => match parse_class(payload) {
            Ok((_, AMQPClass::Connection(m))) => Ok(Some(m)),
            Ok(_) => Err("a method of another class than connection".to_owned()),
            Err(e) => Err(format!("a method frame that cannot be read: {e}")),
        },
        k => Err(format!("a frame of type {k} during the handshake")),
    }
}

/// A method frame on channel 0.
fn method(class: u16, id: u16, args: &[u8]) -> Vec<u8> {
    let size = 4 + args.len();
    let mut f = Vec::with_capacity(size + 8);
    f.push(1);
    f.extend_from_slice(&0u16.to_be_bytes());
    f.extend_from_slice(&(size as u32).to_be_bytes());
    f.extend_from_slice(&class.to_be_bytes());
    f.extend_from_slice(&id.to_be_bytes());
    f.extend_from_slice(args);
    f.push(0xCE);
    f
}

/// A short string: one length byte (longer text is cut at 255 bytes).
fn short(out: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(255)];
    out.push(b.len() as u8);
    out.extend_from_slice(b);
}

/// A long string: a four-byte length.
fn long(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
}

/// `connection.start-ok`: client properties with the connection name,
/// PLAIN with `user` and `password`, locale `en_US`.
fn start_ok(name: &str, user: &str, password: &str) -> Vec<u8> {
    let mut table = Vec::new();
    for (key, value) in [("connection_name", name), ("product", "acemq")] {
        short(&mut table, key);
        table.push(b'S');
        long(&mut table, value.as_bytes());
    }
    let mut args = Vec::new();
    long(&mut args, &table);
    short(&mut args, "PLAIN");
    let response = [b"\0", user.as_bytes(), b"\0", password.as_bytes()].concat();
    long(&mut args, &response);
    short(&mut args, "en_US");
    method(10, 11, &args)
}

/// `connection.tune-ok` with the broker's limits and no heartbeat.
fn tune_ok(channel_max: u16, frame_max: u32) -> Vec<u8> {
    let mut args = Vec::new();
    args.extend_from_slice(&channel_max.to_be_bytes());
    args.extend_from_slice(&frame_max.to_be_bytes());
    args.extend_from_slice(&0u16.to_be_bytes());
    method(10, 31, &args)
}

/// `connection.open` of `vhost`.
fn open(vhost: &str) -> Vec<u8> {
    let mut args = Vec::new();
    short(&mut args, vhost);
    short(&mut args, "");
    args.push(0);
    method(10, 40, &args)
}

/// `connection.close` 200 `OK`.
fn close() -> Vec<u8> {
    let mut args = 200u16.to_be_bytes().to_vec();
    short(&mut args, "OK");
    args.extend_from_slice(&[0, 0, 0, 0]);
    method(10, 50, &args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::protocol::connection::AMQPMethod as M;

    /// The payload of the `connection.start` a RabbitMQ 4.3.6 node sent
    /// (Debian sid's 4.3.6-1, Erlang 29.1.2), as captured.
    const START_4_3_6: &[&str] = &[
        "000a000a0009000001d20c6361706162696c697469657346000000c7127075626c69736865725f636f6e6669",
        "726d7374011a65786368616e67655f65786368616e67655f62696e64696e677374010a62617369632e6e6163",
        "6b740116636f6e73756d65725f63616e63656c5f6e6f74696679740112636f6e6e656374696f6e2e626c6f63",
        "6b6564740113636f6e73756d65725f7072696f72697469657374011c61757468656e7469636174696f6e5f66",
        "61696c7572655f636c6f73657401107065725f636f6e73756d65725f716f7374010f6469726563745f726570",
        "6c795f746f74010c636c75737465725f6e616d65530000000c6163656d712d72343340766d09636f70797269",
        "676874530000003c436f707972696768742028632920323030372d323032362042726f6164636f6d20496e63",
        "20616e642f6f7220697473207375627369646961726965730b696e666f726d6174696f6e53000000394c6963",
        "656e73656420756e64657220746865204d504c20322e302e20576562736974653a2068747470733a2f2f7261",
        "626269746d712e636f6d08706c6174666f726d530000001145726c616e672f4f54502032392e312e32077072",
        "6f6475637453000000085261626269744d510776657273696f6e5300000005342e332e3600000018504c4149",
        "4e20414e4f4e594d4f555320414d51504c41494e00000005656e5f5553",
    ];

    fn unhex(lines: &[&str]) -> Vec<u8> {
        let h: String = lines.concat();
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
            .collect()
    }

    /// A frame built here, read back as a connection method.
    fn parsed(frame: &[u8]) -> M {
        assert_eq!(
            (frame[0], frame[1], frame[2]),
            (1, 0, 0),
            "a method frame on channel 0"
        );
        let size = u32::from_be_bytes([frame[3], frame[4], frame[5], frame[6]]) as usize;
        assert_eq!(frame.len(), size + 8);
        assert_eq!(frame[size + 7], 0xCE);
        decode(1, &frame[7..7 + size]).unwrap().unwrap()
    }

    #[test]
    fn the_version_is_read_from_a_real_connection_start() {
        let Some(M::Start(start)) = decode(1, &unhex(START_4_3_6)).unwrap() else {
            panic!("not connection.start");
        };
        let v = version_of(&start.server_properties);
        assert_eq!(v, BrokerVersion::new("RabbitMQ", "4.3.6"));
        assert!(v.at_least(4, 3));
    }

    #[test]
    fn version_numbers_read_the_leading_digits_and_compare_by_major_and_minor() {
        let n = |s: &str| BrokerVersion::new("RabbitMQ", s).numbers();
        assert_eq!(n("3.10.8"), Some((3, 10, 8)));
        assert_eq!(n("4.3.0-rc.1"), Some((4, 3, 0)));
        assert_eq!(n("4.3"), Some((4, 3, 0)));
        assert_eq!(n("?"), None);
        assert_eq!(n("4"), None);
        let v = |s: &str| BrokerVersion::new("RabbitMQ", s);
        assert!(!v("3.10.8").at_least(4, 3));
        assert!(!v("4.2.9").at_least(4, 3));
        assert!(v("4.4.1").at_least(4, 3) && v("5.0.0").at_least(4, 3));
        assert!(!v("?").at_least(0, 0));
    }

    #[test]
    fn the_frames_sent_read_back_as_the_methods_meant() {
        let M::StartOk(ok) = parsed(&start_ok("shop (version check)", "guest", "s3cret")) else {
            panic!("not start-ok");
        };
        assert_eq!(ok.mechanism.as_str(), "PLAIN");
        assert_eq!(ok.response.as_bytes(), b"\0guest\0s3cret");
        assert_eq!(ok.locale.as_str(), "en_US");
        assert_eq!(
            ok.client_properties.inner().get("connection_name"),
            Some(&AMQPValue::LongString("shop (version check)".into()))
        );
        let M::TuneOk(t) = parsed(&tune_ok(2047, 131072)) else {
            panic!("not tune-ok");
        };
        assert_eq!((t.channel_max, t.frame_max, t.heartbeat), (2047, 131072, 0));
        let M::Open(o) = parsed(&open("/")) else {
            panic!("not open");
        };
        assert_eq!(o.virtual_host.as_str(), "/");
        let M::Close(c) = parsed(&close()) else {
            panic!("not close");
        };
        assert_eq!((c.reply_code, c.reply_text.as_str()), (200, "OK"));
    }

    #[test]
    fn heartbeats_are_skipped_and_other_frames_are_errors() {
        assert!(decode(8, &[]).unwrap().is_none());
        assert!(decode(3, &[1, 2, 3]).is_err());
        assert!(decode(1, &[0, 10, 0]).is_err());
    }

    #[tokio::test]
    async fn an_amqps_address_leaves_the_version_unknown_without_connecting() {
        let e = read_broker_version("amqps://u:p@127.0.0.1:1/%2f", "t", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(e.contains("amqps"), "{e}");
    }

    #[tokio::test]
    async fn a_server_that_hangs_up_after_start_still_gives_its_version() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut header = [0u8; 8];
            s.read_exact(&mut header).await.unwrap();
            assert_eq!(&header, b"AMQP\x00\x00\x09\x01");
            let payload = unhex(START_4_3_6);
            let mut f = vec![1, 0, 0];
            f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            f.extend_from_slice(&payload);
            f.push(0xCE);
            s.write_all(&f).await.unwrap();
            let mut frame = vec![0u8; 7];
            s.read_exact(&mut frame).await.unwrap();
            let size = u32::from_be_bytes([frame[3], frame[4], frame[5], frame[6]]) as usize;
            frame.resize(size + 8, 0);
            s.read_exact(&mut frame[7..]).await.unwrap();
            frame
        });
        let addr = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
        let v = read_broker_version(&addr, "t", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(v.version, "4.3.6");
        let sent = server.await.unwrap();
        assert!(matches!(parsed(&sent), M::StartOk(_)), "{sent:?}");
    }

    #[tokio::test]
    async fn a_port_nothing_listens_on_is_an_error_not_a_version() {
        let e = read_broker_version("amqp://u:p@127.0.0.1:1/%2f", "t", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(e.contains("cannot connect"), "{e}");
    }
}
