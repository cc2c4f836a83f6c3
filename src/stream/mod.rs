//! RabbitMQ streams, consuming side: acemq's own client of the stream
//! protocol (the stream plugin, port 5552, plain TCP).
//!
//! [`StreamClient::connect`] opens a connection and returns its events
//! ([`StreamEvent`]); [`StreamClient::subscribe`] starts a subscription at
//! an [`OffsetSpec`] with some credit (chunks), and each [`Chunk`] it
//! delivers holds [`StreamMessage`]s decoded from AMQP 1.0 ([`amqp10`]).
//! One reader task parses frames in socket order, so chunks arrive in
//! offset order whatever the credit. A record that cannot be decoded is a
//! message marked [`malformed`](StreamMessage::malformed), never an error
//! of the connection.
//!
//! ```no_run
//! # async fn run() -> Result<(), acemq::stream::StreamError> {
//! use acemq::stream::{OffsetSpec, StreamClient, StreamEvent, StreamOptions};
//! let (client, mut events) = StreamClient::connect(&StreamOptions::default()).await?;
//! client.subscribe(1, "orders", OffsetSpec::First, 2, &[]).await?;
//! while let Some(event) = events.recv().await {
//!     match event {
//!         StreamEvent::Chunk(chunk) => {
//!             for m in &chunk.messages {
//!                 println!("{} {:?}", m.offset, m.properties.message_id);
//!             }
//!             client.credit(chunk.subscription, 1)?;
//!         }
//!         StreamEvent::Closed(why) => return Err(why),
//!         _ => {}
//!     }
//! }
//! # Ok(())
//! # }
//! ```

pub mod amqp10;
mod client;
mod error;
mod protocol;
#[cfg(test)]
mod tests;
mod types;
mod wire;

pub use client::{StreamClient, StreamOptions, REQUEST_TIMEOUT};
pub use error::{ResponseCode, StreamError};
pub use types::{
    BrokerAddress, Chunk, OffsetSpec, StreamEvent, StreamMessage, StreamMetadata, StreamStats,
};
