//! Reading and writing the protocol's primitive types: big-endian
//! integers, strings (`int16` length) and byte arrays (`int32` length).
//! The reader never trusts a length: every read checks what is left first.

use bytes::{BufMut, Bytes, BytesMut};

/// Why a read failed: what was being read, for the error's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Short(pub(crate) &'static str);

/// A cursor over received bytes; reads fail rather than panic past the end.
#[derive(Debug, Clone)]
pub(crate) struct Reader {
    buf: Bytes,
    pos: usize,
}

impl Reader {
    pub(crate) fn new(buf: Bytes) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes left.
    pub(crate) fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes, shared with the frame (no copy).
    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<Bytes, Short> {
        if self.left() < n {
            return Err(Short(what));
        }
        let out = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Short> {
        if self.left() < N {
            return Err(Short(what));
        }
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.pos..self.pos + N]);
        self.pos += N;
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, Short> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, Short> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, Short> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, Short> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn i64(&mut self, what: &'static str) -> Result<i64, Short> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    /// A string: `int16` length (-1 for null, read as empty), then UTF-8
    /// (invalid bytes replaced).
    pub(crate) fn string(&mut self, what: &'static str) -> Result<String, Short> {
        let len = self.u16(what)? as i16;
        if len < 0 {
            return Ok(String::new());
        }
        let bytes = self.take(len as usize, what)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// An array's count (`int32`), checked against the bytes left: each
    /// element takes at least `min_size` bytes, so a count that lies is
    /// refused before anything is allocated.
    pub(crate) fn count(&mut self, min_size: usize, what: &'static str) -> Result<usize, Short> {
        let n = self.u32(what)? as i32;
        if n < 0 {
            return Ok(0);
        }
        let n = n as usize;
        if n.saturating_mul(min_size.max(1)) > self.left() {
            return Err(Short(what));
        }
        Ok(n)
    }

    /// `(key, value)` string pairs: peer and connection properties.
    pub(crate) fn pairs(&mut self, what: &'static str) -> Result<Vec<(String, String)>, Short> {
        let n = self.count(4, what)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push((self.string(what)?, self.string(what)?));
        }
        Ok(out)
    }
}

/// Writes a string: `int16` length then its bytes; `None` when it is over
/// the protocol's 32,767 bytes.
pub(crate) fn put_string(buf: &mut BytesMut, s: &str) -> Option<()> {
    let len = i16::try_from(s.len()).ok()?;
    buf.put_i16(len);
    buf.put_slice(s.as_bytes());
    Some(())
}

/// Writes a byte array: `int32` length then the bytes.
pub(crate) fn put_bytes(buf: &mut BytesMut, b: &[u8]) -> Option<()> {
    let len = i32::try_from(b.len()).ok()?;
    buf.put_i32(len);
    buf.put_slice(b);
    Some(())
}
