//! The connection to the stream plugin: connect, subscribe, credit, offsets,
//! metadata; plain TCP only.

mod conn;
mod handshake;
mod io;
mod metadata;
mod options;
mod state;

pub use conn::{StreamClient, REQUEST_TIMEOUT};
#[cfg(test)]
pub(crate) use io::{read_frame, reader, Limits};
pub use options::StreamOptions;
#[cfg(test)]
pub(crate) use state::State;
