//! AMQP 1.0 values, read without recursion: compound values (lists, maps,
//! arrays) are kept on an explicit stack no deeper than
//! [`MAX_HEADER_DEPTH`], and one budget of [`MAX_HEADER_VALUES`] values is
//! spent across a message's header sections. A value over either limit, or
//! cut short, is an error (the message is malformed), never a deep stack or
//! an allocation its bytes cannot back.

use bytes::Bytes;

use acemq_layers::{Headers, Value};

use crate::convert::{MAX_HEADER_DEPTH, MAX_HEADER_VALUES};
use crate::stream::wire::{Reader, Short};

/// How many values a message's header sections may still hold.
#[derive(Debug)]
pub(crate) struct Budget(usize);

impl Budget {
    pub(crate) fn new() -> Self {
        Budget(MAX_HEADER_VALUES)
    }

    fn spend(&mut self, n: usize) -> Result<(), String> {
        self.0 = self.0.checked_sub(n).ok_or_else(|| {
            format!("header sections holding more than {MAX_HEADER_VALUES} values")
        })?;
        Ok(())
    }
}

fn short(Short(what): Short) -> String {
    format!("cut short in {what}")
}

/// A compound value being read.
enum Open {
    List {
        left: usize,
        items: Vec<Value>,
    },
    Map {
        left: usize,
        key: Option<String>,
        items: Vec<(String, Value)>,
    },
    Array {
        left: usize,
        code: u8,
        items: Vec<Value>,
    },
}

impl Open {
    fn left(&self) -> usize {
        match self {
            Open::List { left, .. } | Open::Map { left, .. } | Open::Array { left, .. } => *left,
        }
    }

    fn push(&mut self, v: Value) {
        match self {
            Open::List { left, items } | Open::Array { left, items, .. } => {
                *left -= 1;
                items.push(v);
            }
            Open::Map { left, key, items } => {
                *left -= 1;
                match key.take() {
                    None => *key = Some(text_of(&v)),
                    Some(k) => items.push((k, v)),
                }
            }
        }
    }

    fn finish(self) -> Value {
        match self {
            Open::List { items, .. } | Open::Array { items, .. } => Value::Array(items),
            Open::Map { items, .. } => Value::Table(items.into_iter().collect::<Headers>()),
        }
    }
}

/// A value as text: strings as they are, numbers in decimal, bytes as
/// UTF-8 (invalid bytes replaced). For map keys and ids.
pub(crate) fn text_of(v: &Value) -> String {
    match v {
        Value::String(b) | Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        Value::Bool(b) => b.to_string(),
        Value::F32(f) => f.to_string(),
        Value::F64(f) => f.to_string(),
        Value::Void => String::new(),
        other => other
            .as_i64()
            .map(|n| n.to_string())
            .unwrap_or_else(|| format!("{other:?}")),
    }
}

/// Reads a constructor: the type code, past any descriptor (skipped).
/// A descriptor may itself be described (`0x00 0x00 ...`): those are
/// counted, not recursed into.
fn constructor(r: &mut Reader) -> Result<u8, String> {
    let mut descriptors = 0usize;
    loop {
        let code = r.u8("a constructor").map_err(short)?;
        if code == 0x00 {
            descriptors += 1;
            continue;
        }
        if descriptors == 0 {
            return Ok(code);
        }
        skip_body(code, r)?;
        descriptors -= 1;
    }
}

/// Skips one value without reading it: a compound value by its size, so
/// nothing nested is visited.
pub(crate) fn skip(r: &mut Reader) -> Result<(), String> {
    let code = constructor(r)?;
    skip_body(code, r)
}

/// Skips what follows the type code `code`.
fn skip_body(code: u8, r: &mut Reader) -> Result<(), String> {
    let n = match code {
        0x40..=0x45 => 0,
        0x50..=0x56 => 1,
        0x60 | 0x61 => 2,
        0x70..=0x74 => 4,
        0x80..=0x84 => 8,
        0x94 | 0x98 => 16,
        0xa0 | 0xa1 | 0xa3 | 0xc0 | 0xc1 | 0xe0 => r.u8("a size").map_err(short)? as usize,
        0xb0 | 0xb1 | 0xb3 | 0xd0 | 0xd1 | 0xf0 => r.u32("a size").map_err(short)? as usize,
        other => return Err(format!("an unknown type code 0x{other:02x}")),
    };
    r.take(n, "a value").map_err(short)?;
    Ok(())
}

/// Reads one value into a [`Value`], within the depth limit and `budget`.
pub(crate) fn read(r: &mut Reader, budget: &mut Budget) -> Result<Value, String> {
    let mut stack: Vec<Open> = Vec::new();
    loop {
        let code = match stack.last() {
            Some(Open::Array { code, .. }) => *code,
            _ => constructor(r)?,
        };
        budget.spend(1)?;
        let mut done = match primitive(code, r)? {
            Some(v) => Some(v),
            None => {
                let open = compound(code, r, budget)?;
                if open.left() == 0 {
                    Some(open.finish())
                } else {
                    if stack.len() >= MAX_HEADER_DEPTH {
                        return Err(format!(
                            "values nested deeper than {MAX_HEADER_DEPTH} levels"
                        ));
                    }
                    stack.push(open);
                    None
                }
            }
        };
        while let Some(v) = done.take() {
            let Some(top) = stack.last_mut() else {
                return Ok(v);
            };
            top.push(v);
            if top.left() == 0 {
                done = stack.pop().map(Open::finish);
            }
        }
    }
}

/// Opens a list, map or array: its size and count checked against the
/// bytes left and the budget before anything is allocated.
fn compound(code: u8, r: &mut Reader, budget: &Budget) -> Result<Open, String> {
    let wide = matches!(code, 0xd0 | 0xd1 | 0xf0);
    let (size, count) = match code {
        0x45 => (0, 0),
        0xc0 | 0xc1 | 0xe0 => (
            r.u8("a size").map_err(short)? as usize,
            r.u8("a count").map_err(short)? as usize,
        ),
        0xd0 | 0xd1 | 0xf0 => (
            r.u32("a size").map_err(short)? as usize,
            r.u32("a count").map_err(short)? as usize,
        ),
        other => return Err(format!("an unknown type code 0x{other:02x}")),
    };
    let counted = if code == 0x45 {
        0
    } else if wide {
        4
    } else {
        1
    };
    if size < counted || size - counted > r.left() {
        return Err("a compound value whose size is over the bytes left".into());
    }
    if count > budget.0 {
        return Err(format!(
            "a compound value of {count} values, over the {MAX_HEADER_VALUES} allowed"
        ));
    }
    Ok(match code {
        0xc1 | 0xd1 if count % 2 != 0 => return Err("a map with an odd count".into()),
        0xc1 | 0xd1 => Open::Map {
            left: count,
            key: None,
            items: Vec::with_capacity(count / 2),
        },
        0xe0 | 0xf0 => {
            let element = constructor(r)?;
            Open::Array {
                left: count,
                code: element,
                items: Vec::with_capacity(count),
            }
        }
        _ => Open::List {
            left: count,
            items: Vec::with_capacity(count),
        },
    })
}

/// A primitive value of `code`; `None` for a compound one.
fn primitive(code: u8, r: &mut Reader) -> Result<Option<Value>, String> {
    let s = |e| short(e);
    Ok(Some(match code {
        0x40 => Value::Void,
        0x41 => Value::Bool(true),
        0x42 => Value::Bool(false),
        0x56 => Value::Bool(r.u8("a boolean").map_err(s)? != 0),
        0x50 => Value::U8(r.u8("a ubyte").map_err(s)?),
        0x60 => Value::U16(r.u16("a ushort").map_err(s)?),
        0x70 => Value::U32(r.u32("a uint").map_err(s)?),
        0x52 => Value::U32(r.u8("a smalluint").map_err(s)?.into()),
        0x43 => Value::U32(0),
        0x80 => ulong(r.u64("a ulong").map_err(s)?),
        0x53 => Value::I64(r.u8("a smallulong").map_err(s)?.into()),
        0x44 => Value::I64(0),
        0x51 => Value::I8(r.u8("a byte").map_err(s)? as i8),
        0x61 => Value::I16(r.u16("a short").map_err(s)? as i16),
        0x71 => Value::I32(r.u32("an int").map_err(s)? as i32),
        0x54 => Value::I32((r.u8("a smallint").map_err(s)? as i8).into()),
        0x81 => Value::I64(r.i64("a long").map_err(s)?),
        0x55 => Value::I64((r.u8("a smalllong").map_err(s)? as i8).into()),
        0x72 => Value::F32(f32::from_bits(r.u32("a float").map_err(s)?)),
        0x82 => Value::F64(f64::from_bits(r.u64("a double").map_err(s)?)),
        0x74 => Value::Bytes(r.take(4, "a decimal32").map_err(s)?.to_vec()),
        0x84 => Value::Bytes(r.take(8, "a decimal64").map_err(s)?.to_vec()),
        0x94 => Value::Bytes(r.take(16, "a decimal128").map_err(s)?.to_vec()),
        0x73 => {
            let c = char::from_u32(r.u32("a char").map_err(s)?).unwrap_or('\u{fffd}');
            Value::String(c.to_string().into_bytes())
        }
        0x83 => {
            let ms = r.i64("a timestamp").map_err(s)?;
            u64::try_from(ms).map_or(Value::I64(ms), |ms| Value::Timestamp(ms / 1000))
        }
        0x98 => Value::String(uuid(&r.take(16, "a uuid").map_err(s)?).into_bytes()),
        0xa0 | 0xa1 | 0xa3 | 0xb0 | 0xb1 | 0xb3 => {
            let len = if code & 0xf0 == 0xa0 {
                r.u8("a length").map_err(s)? as usize
            } else {
                r.u32("a length").map_err(s)? as usize
            };
            let bytes: Bytes = r.take(len, "a string").map_err(s)?;
            if code & 0x0f == 0 {
                Value::Bytes(bytes.to_vec())
            } else {
                Value::String(bytes.to_vec())
            }
        }
        _ => return Ok(None),
    }))
}

/// A `ulong`: an `I64` when it fits, else its decimal text (acemq's
/// [`Value`] has no unsigned 64-bit type).
fn ulong(v: u64) -> Value {
    i64::try_from(v).map_or_else(|_| Value::String(v.to_string().into_bytes()), Value::I64)
}

fn uuid(b: &[u8]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}
