use std::error::Error;
use std::fmt;

/// A delivery without message id, refused by an inbox set to
/// [`MissingId::Reject`](super::MissingId::Reject). It is wrapped in a
/// [`Reject`](crate::Reject): permanent, dead-lettered at once.
#[derive(Debug)]
pub struct MissingMessageId {
    queue: String,
}

impl MissingMessageId {
    pub(crate) fn new(queue: &str) -> Self {
        MissingMessageId {
            queue: queue.to_owned(),
        }
    }
}

impl fmt::Display for MissingMessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "delivery from {:?} has no message id, and the inbox rejects those: \
             publish with a message id, or set the inbox to MissingId::Handle",
            self.queue
        )
    }
}

impl Error for MissingMessageId {}
