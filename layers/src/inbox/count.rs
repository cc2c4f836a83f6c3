//! The duplicates the inbox skipped, counted per queue for the runner's
//! health snapshot.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

/// Duplicates per queue name, in this process. Written once per duplicate
/// (rare), read once per queue per snapshot.
static DUPLICATES: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// How many deliveries from `queue` an [`Inbox`](super::Inbox) in this
/// process recognised as already processed and acknowledged without calling
/// the handler (the `acemq.inbox.duplicates` metric, as a number the health
/// snapshot and the admin router's `/queues` show). Counted per process by
/// queue name, whichever inbox store is used.
pub fn duplicates(queue: &str) -> u64 {
    DUPLICATES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(queue)
        .copied()
        .unwrap_or(0)
}

pub(super) fn count_duplicate(queue: &str) {
    let mut counts = DUPLICATES.lock().unwrap_or_else(PoisonError::into_inner);
    match counts.get_mut(queue) {
        Some(n) => *n += 1,
        None => {
            counts.insert(queue.to_owned(), 1);
        }
    }
}
