//! A bounded AMQP 1.0 message decoder: a stream's records are AMQP 1.0
//! messages (RabbitMQ converts what AMQP 0-9-1 publishers send).
//!
//! Sections read: `header` (durable → `delivery_mode` 2, priority, ttl →
//! `expiration`), `properties` (message-id and correlation-id as strings
//! whatever their AMQP type; user-id; subject → `kind`; reply-to (RabbitMQ
//! 4's `/queues/<name>` address back to the queue's name);
//! content-type; content-encoding; creation-time → `timestamp` in seconds;
//! group-id → `app_id`, where RabbitMQ 4 writes AMQP 0-9-1's app-id),
//! `application-properties` (→ headers), `message-annotations` (those whose
//! keys start with `x-` → headers too), `data` (concatenated into the body),
//! `amqp-value` (a binary or string is the body; any other value's encoding
//! is), `amqp-sequence` (its encoding is the body). `delivery-annotations`
//! and `footer` are skipped. The annotations RabbitMQ writes for the
//! AMQP 0-9-1 properties AMQP 1.0 has no field for (`x-basic-type`,
//! `x-basic-app-id`, `x-basic-delivery-mode`, `x-basic-priority`,
//! `x-basic-expiration`) go back into the properties, not the headers;
//! `x-exchange` and `x-routing-key` (where it was published) stay headers.
//!
//! AMQP 1.0 types map to [`Value`](acemq_layers::Value): booleans, integers
//! and floats to theirs (a `ulong` to `I64`, or its decimal text when over
//! `i64::MAX`), strings and symbols to `String`, binaries and decimals (raw)
//! to `Bytes`, a timestamp to `Timestamp` in seconds (`I64` milliseconds
//! when before 1970), a uuid to its hyphenated text, lists and arrays to
//! `Array`, maps to `Table` (keys as text).
//!
//! The decoder never recurses: nesting is bounded by
//! [`MAX_HEADER_DEPTH`](crate::convert::MAX_HEADER_DEPTH) and a message's
//! header sections by
//! [`MAX_HEADER_VALUES`](crate::convert::MAX_HEADER_VALUES) values;
//! anything over them, cut short or of an unknown type gives a malformed
//! message, never an error of the connection.

mod message;
mod value;

pub use message::decode;
