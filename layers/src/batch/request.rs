//! What a batch handler is given ([`Batch`]) and what it may answer
//! ([`IntoOutcomes`]).

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use crate::{BoxError, Cancellation, Delivery, IntoVerdict, Verdict};

/// The request of a batch handler: deliveries of one queue, in the order
/// they arrived, handled together (one statement for many rows).
///
/// A first attempt brings up to the batch's `max_size` deliveries; an
/// in-process retry brings the one delivery being retried.
#[derive(Debug, Clone)]
pub struct Batch {
    deliveries: Vec<Delivery>,
}

impl Batch {
    /// A batch of `deliveries` (tests and benches; acemq forms its own).
    pub fn new(deliveries: Vec<Delivery>) -> Self {
        Batch { deliveries }
    }

    /// The deliveries, in arrival order.
    pub fn deliveries(&self) -> &[Delivery] {
        &self.deliveries
    }

    /// How many deliveries the batch holds (at least 1).
    pub fn len(&self) -> usize {
        self.deliveries.len()
    }

    /// Whether the batch holds no delivery (never, for a batch acemq forms).
    pub fn is_empty(&self) -> bool {
        self.deliveries.is_empty()
    }

    /// The deliveries, in arrival order.
    pub fn iter(&self) -> std::slice::Iter<'_, Delivery> {
        self.deliveries.iter()
    }

    /// The handlers' cancellation (every delivery of a batch carries the
    /// same one): it fires at the drain's deadline, or when the channel is
    /// lost.
    pub fn token(&self) -> &Cancellation {
        match self.deliveries.first() {
            Some(d) => d.token(),
            None => Cancellation::never_ref(),
        }
    }

    /// The deliveries, owned.
    pub fn into_deliveries(self) -> Vec<Delivery> {
        self.deliveries
    }
}

impl<'a> IntoIterator for &'a Batch {
    type Item = &'a Delivery;
    type IntoIter = std::slice::Iter<'a, Delivery>;

    fn into_iter(self) -> Self::IntoIter {
        self.deliveries.iter()
    }
}

/// One outcome per delivery of a batch, in the batch's order: what each
/// delivery's own retry, dead-letter and acknowledgement act on.
pub type Outcomes = Vec<Result<Verdict, BoxError>>;

/// The `Ok` types a batch handler may return:
///
/// - `()`: every delivery succeeded (acknowledged);
/// - a [`Verdict`]: the same verdict for every delivery;
/// - `Vec<Result<V, E>>`, one per delivery in the batch's order, `V` being
///   `()` or [`Verdict`]: each delivery's own outcome — an error is retried
///   or dead-lettered for that delivery alone. A vector of another length
///   than the batch fails every delivery of it (transient: each is retried
///   alone).
///
/// An `Err` from the handler fails every delivery of the batch with that
/// error (classified once per delivery, as a single handler's would be).
pub trait IntoOutcomes {
    /// The outcomes of a batch of `len` deliveries.
    fn into_outcomes(self, len: usize) -> Outcomes;
}

impl IntoOutcomes for () {
    fn into_outcomes(self, len: usize) -> Outcomes {
        (0..len).map(|_| Ok(Verdict::Ack)).collect()
    }
}

impl IntoOutcomes for Verdict {
    fn into_outcomes(self, len: usize) -> Outcomes {
        (0..len).map(|_| Ok(self.clone())).collect()
    }
}

impl<V, E> IntoOutcomes for Vec<Result<V, E>>
where
    V: IntoVerdict,
    E: Into<BoxError>,
{
    fn into_outcomes(self, len: usize) -> Outcomes {
        if self.len() != len {
            let error = BatchFailed::new(
                format!(
                    "the batch handler returned {} outcomes for {len} deliveries",
                    self.len()
                )
                .into(),
            );
            return error.for_each(len);
        }
        self.into_iter()
            .map(|r| r.map(IntoVerdict::into_verdict).map_err(Into::into))
            .collect()
    }
}

/// The error every delivery of a batch gets when the batch handler fails
/// as a whole; its source is the handler's error, so a classifier sees it
/// (a [`Reject`](crate::Reject) in it dead-letters each delivery).
#[derive(Clone)]
pub struct BatchFailed {
    error: Arc<dyn StdError + Send + Sync + 'static>,
}

impl BatchFailed {
    pub(crate) fn new(error: BoxError) -> Self {
        BatchFailed {
            error: Arc::from(error),
        }
    }

    /// The same error for each of `len` deliveries.
    pub(crate) fn for_each(self, len: usize) -> Outcomes {
        (0..len)
            .map(|_| Err(Box::new(self.clone()) as BoxError))
            .collect()
    }
}

impl fmt::Debug for BatchFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BatchFailed").field(&self.error).finish()
    }
}

impl fmt::Display for BatchFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the batch failed")
    }
}

impl StdError for BatchFailed {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.error)
    }
}
