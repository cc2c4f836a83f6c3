//! Unit tests of the stream client's decoding: AMQP 1.0 messages, osiris
//! chunks and frames, hostile input included.

mod amqp10;
mod chunk;
mod encode;
mod frame;
mod reader;
