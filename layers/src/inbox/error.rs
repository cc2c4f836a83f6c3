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
             publish with a message id (or key the inbox with InboxLayer::key_fn), or set the inbox to MissingId::Handle",
            self.queue
        )
    }
}

impl Error for MissingMessageId {}

/// The handler ended the inbox's transaction itself — a `COMMIT` or
/// `ROLLBACK` sent as a statement, or a transaction of its own begun and
/// ended on the same connection — so the work and the mark no longer commit
/// together. A store finds it at commit and fails with this error (in its
/// source chain).
///
/// A programming error, not a transient failure: the retry and dead-letter
/// layers recognise it wherever it sits in the error, whatever the
/// classifier says, and dead-letter the delivery at once with reason
/// [`transaction-ended`](crate::Reason::TransactionEnded). The store removes
/// a mark that was committed early, so the message is handled again when it
/// is replayed after the handler is fixed. Work the handler committed early
/// stays committed: the store cannot take it back.
#[derive(Debug)]
pub struct TransactionEnded {
    key: Option<(String, String)>,
}

impl TransactionEnded {
    /// The transaction of the delivery with `key` — (queue, message id),
    /// as given to [`InboxStore::begin`](super::InboxStore::begin); `None`
    /// for a delivery without message id — was ended by its handler.
    pub fn new(key: Option<(&str, &str)>) -> Self {
        TransactionEnded {
            key: key.map(|(q, id)| (q.to_owned(), id.to_owned())),
        }
    }

    /// The (queue, message id) of the delivery, if it had a message id.
    pub fn key(&self) -> Option<(&str, &str)> {
        self.key.as_ref().map(|(q, id)| (q.as_str(), id.as_str()))
    }

    /// Whether `error` is a `TransactionEnded` or carries one anywhere in
    /// its [`source()`](Error::source) chain.
    pub fn is_in(error: &(dyn Error + 'static)) -> bool {
        std::iter::successors(Some(error), |e: &&(dyn Error + 'static)| (*e).source())
            .any(|e| e.is::<TransactionEnded>() || e.is::<Box<TransactionEnded>>())
    }
}

impl fmt::Display for TransactionEnded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the handler ended the inbox's transaction itself (")?;
        match &self.key {
            Some((queue, id)) => write!(f, "queue {queue:?}, message id {id:?}")?,
            None => f.write_str("a delivery without message id")?,
        }
        f.write_str(
            "): its work and the inbox mark did not commit together; send no COMMIT, ROLLBACK \
             or BEGIN on the inbox's transaction (the inbox layer commits it after the handler \
             returns Ok)",
        )
    }
}

impl Error for TransactionEnded {}
