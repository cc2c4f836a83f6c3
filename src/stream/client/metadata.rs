//! The bodies of the metadata and stream-stats responses.

use crate::stream::error::ResponseCode;
use crate::stream::types::{BrokerAddress, StreamMetadata};
use crate::stream::wire::{Reader, Short};

/// `[Broker] [StreamMetadata]`: brokers by reference, then each stream's
/// code, leader reference (`0xffff` for none) and replica references.
pub(crate) fn parse(mut b: Reader) -> Result<Vec<StreamMetadata>, Short> {
    let n = b.count(10, "metadata's brokers")?;
    let mut brokers = Vec::with_capacity(n);
    for _ in 0..n {
        let reference = b.u16("a broker")?;
        let host = b.string("a broker")?;
        let port = b.u32("a broker")?;
        brokers.push((reference, BrokerAddress { host, port }));
    }
    let find = |r: u16| {
        brokers
            .iter()
            .find(|(n, _)| *n == r)
            .map(|(_, a)| a.clone())
    };
    let n = b.count(10, "metadata's streams")?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let stream = b.string("a stream's metadata")?;
        let code = ResponseCode::from_u16(b.u16("a stream's metadata")?);
        let leader = find(b.u16("a stream's metadata")?);
        let replicas = b.count(2, "a stream's replicas")?;
        let mut list = Vec::with_capacity(replicas);
        for _ in 0..replicas {
            if let Some(a) = find(b.u16("a replica")?) {
                list.push(a);
            }
        }
        out.push(StreamMetadata {
            stream,
            code,
            leader,
            replicas: list,
        });
    }
    Ok(out)
}

/// `[Key Value]` of stream-stats: names and `int64` values.
pub(crate) fn stats(b: &mut Reader) -> Result<Vec<(String, i64)>, Short> {
    let n = b.count(10, "stream-stats")?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push((b.string("stream-stats")?, b.i64("stream-stats")?));
    }
    Ok(out)
}
