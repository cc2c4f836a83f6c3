//! The relay's counters: [`Stats`], kept as it runs (each batch adds to
//! them), and [`RelayStats`], the snapshot its handle gives.

use std::sync::atomic::AtomicU64;

/// Counters the relay keeps (also sent to the `metrics` facade).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) published: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) failed_batches: AtomicU64,
    pub(crate) cleaned: AtomicU64,
    pub(crate) in_flight: AtomicU64,
}

/// A snapshot of a relay's counters.
///
/// Example: the [module docs](crate::outbox); runnable: `examples/outbox.rs`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStats {
    /// Rows published, confirmed and marked sent.
    pub published: u64,
    /// Rows marked failed (returned unroutable, or unreadable).
    pub failed: u64,
    /// Batches that failed (broker or database), each followed by a backoff.
    pub failed_batches: u64,
    /// Sent rows deleted by cleanup.
    pub cleaned: u64,
    /// Rows claimed now and not yet marked or released (at most three
    /// batches: one marking, one publishing, one claimed ahead): were the
    /// relay killed at this moment, its next start publishes them, those of
    /// the first two a second time.
    pub in_flight: u64,
}
