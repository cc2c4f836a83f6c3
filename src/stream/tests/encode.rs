//! A small AMQP 1.0 and osiris encoder for the tests, and a deterministic
//! byte mutator for the fuzz loops.

use bytes::{BufMut, Bytes, BytesMut};

use crate::stream::protocol::chunk::crc32;

/// An AMQP 1.0 value to encode.
#[derive(Clone, Debug)]
pub(super) enum V {
    Null,
    Bool(bool),
    UByte(u8),
    Int(i32),
    Long(i64),
    ULong(u64),
    Double(f64),
    Ts(i64),
    Uuid([u8; 16]),
    Bin(Vec<u8>),
    Str(String),
    Sym(String),
    List(Vec<V>),
    Map(Vec<(V, V)>),
    /// An array of ints.
    IntArray(Vec<i32>),
}

pub(super) fn s(x: &str) -> V {
    V::Str(x.into())
}

pub(super) fn sym(x: &str) -> V {
    V::Sym(x.into())
}

pub(super) fn put(b: &mut BytesMut, v: &V) {
    match v {
        V::Null => b.put_u8(0x40),
        V::Bool(true) => b.put_u8(0x41),
        V::Bool(false) => b.put_u8(0x42),
        V::UByte(x) => {
            b.put_u8(0x50);
            b.put_u8(*x);
        }
        V::Int(x) => {
            b.put_u8(0x71);
            b.put_i32(*x);
        }
        V::Long(x) => {
            b.put_u8(0x81);
            b.put_i64(*x);
        }
        V::ULong(x) => {
            b.put_u8(0x80);
            b.put_u64(*x);
        }
        V::Double(x) => {
            b.put_u8(0x82);
            b.put_f64(*x);
        }
        V::Ts(x) => {
            b.put_u8(0x83);
            b.put_i64(*x);
        }
        V::Uuid(x) => {
            b.put_u8(0x98);
            b.put_slice(x);
        }
        V::Bin(x) => {
            b.put_u8(0xb0);
            b.put_u32(x.len() as u32);
            b.put_slice(x);
        }
        V::Str(x) => {
            b.put_u8(0xa1);
            b.put_u8(x.len() as u8);
            b.put_slice(x.as_bytes());
        }
        V::Sym(x) => {
            b.put_u8(0xb3);
            b.put_u32(x.len() as u32);
            b.put_slice(x.as_bytes());
        }
        V::List(items) => compound(b, 0xd0, items.len(), |inner| {
            for i in items {
                put(inner, i);
            }
        }),
        V::Map(pairs) => compound(b, 0xd1, pairs.len() * 2, |inner| {
            for (k, v) in pairs {
                put(inner, k);
                put(inner, v);
            }
        }),
        V::IntArray(items) => compound(b, 0xf0, items.len(), |inner| {
            inner.put_u8(0x71);
            for i in items {
                inner.put_i32(*i);
            }
        }),
    }
}

fn compound(b: &mut BytesMut, code: u8, count: usize, body: impl FnOnce(&mut BytesMut)) {
    let mut inner = BytesMut::new();
    body(&mut inner);
    b.put_u8(code);
    b.put_u32(inner.len() as u32 + 4);
    b.put_u32(count as u32);
    b.put_slice(&inner);
}

/// A section: `0x00 0x53 descriptor` then the value.
pub(super) fn section(b: &mut BytesMut, descriptor: u8, v: &V) {
    b.put_u8(0x00);
    b.put_u8(0x53);
    b.put_u8(descriptor);
    put(b, v);
}

/// A data section of `body`.
pub(super) fn data(b: &mut BytesMut, body: &[u8]) {
    section(b, 0x75, &V::Bin(body.to_vec()));
}

/// A message of one data section with `app` as application properties.
pub(super) fn message(body: &[u8], app: Vec<(V, V)>) -> Bytes {
    let mut b = BytesMut::new();
    section(&mut b, 0x74, &V::Map(app));
    data(&mut b, body);
    b.freeze()
}

/// An entry of a chunk.
pub(super) enum Entry {
    Simple(Bytes),
    /// A sub-entry batch: compression code and its records.
    Batch(u8, Vec<Bytes>),
}

/// An osiris chunk (user type) of `entries`, its CRC computed.
pub(super) fn chunk(first_offset: u64, timestamp: i64, entries: &[Entry]) -> Bytes {
    let mut data = BytesMut::new();
    let mut records = 0u32;
    for e in entries {
        match e {
            Entry::Simple(r) => {
                data.put_u32(r.len() as u32);
                data.put_slice(r);
                records += 1;
            }
            Entry::Batch(compression, rs) => {
                let mut batch = BytesMut::new();
                for r in rs {
                    batch.put_u32(r.len() as u32);
                    batch.put_slice(r);
                }
                data.put_u8(0x80 | (compression << 4));
                data.put_u16(rs.len() as u16);
                data.put_u32(batch.len() as u32);
                data.put_u32(batch.len() as u32);
                data.put_slice(&batch);
                records += rs.len() as u32;
            }
        }
    }
    let mut b = BytesMut::new();
    b.put_u8(0x50);
    b.put_u8(0);
    b.put_u16(entries.len() as u16);
    b.put_u32(records);
    b.put_i64(timestamp);
    b.put_u64(1);
    b.put_u64(first_offset);
    b.put_u32(crc32(&data));
    b.put_u32(data.len() as u32);
    b.put_u32(0);
    b.put_u32(0);
    b.put_slice(&data);
    b.freeze()
}

/// A deterministic generator (xorshift64*).
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `input` with a few bytes changed, cut or grown.
    pub(super) fn mutate(&mut self, input: &[u8]) -> Vec<u8> {
        let mut out = input.to_vec();
        for _ in 0..=(self.next() % 4) {
            if out.is_empty() {
                break;
            }
            let at = (self.next() as usize) % out.len();
            match self.next() % 5 {
                0 => out[at] = self.next() as u8,
                1 => out[at] = 0xff,
                2 => out.truncate(at),
                3 => out.insert(at, self.next() as u8),
                _ => out[at] ^= 1 << (self.next() % 8),
            }
        }
        out
    }
}
