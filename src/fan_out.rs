//! Many independent broker calls at once, each on a channel of its own:
//! a thousand queues declare and open in a fraction of the time one after
//! another takes, while the outcome reads as if they had run in order.

use std::future::Future;

use futures::future::{BoxFuture, FutureExt};
use futures::{StreamExt, TryStreamExt};

/// How many calls are outstanding at once: enough to hide the round trips,
/// few enough not to flood the broker with channels.
pub(crate) const AT_ONCE: usize = 16;

/// Runs `op` on every item, [`AT_ONCE`] at a time; the results in the
/// items' order. The first failure in that order is returned, and nothing
/// new starts after it (calls already running are dropped).
///
/// Boxed, and `Send` stated here: a stream of futures borrowing their items
/// otherwise defeats the compiler's proof that a task spawning it is `Send`.
pub(crate) fn in_order<'a, I, F, Fut, T, E>(items: I, op: F) -> BoxFuture<'a, Result<Vec<T>, E>>
where
    I: IntoIterator + 'a,
    I::IntoIter: Send + 'a,
    F: FnMut(I::Item) -> Fut + Send + 'a,
    Fut: Future<Output = Result<T, E>> + Send + 'a,
    T: Send + 'a,
    E: Send + 'a,
{
    futures::stream::iter(items)
        .map(op)
        .buffered(AT_ONCE)
        .try_collect()
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn results_come_in_order_with_at_most_at_once_running() {
        let running = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let out = in_order(0..100u64, |i| {
            let (running, most) = (&running, &most);
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                // Later items finish first: the order is still the items'.
                tokio::time::sleep(Duration::from_millis(100 - i)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, ()>(i * 2)
            }
        })
        .await
        .unwrap();
        assert_eq!(out, (0..100).map(|i| i * 2).collect::<Vec<_>>());
        assert_eq!(most.load(Ordering::SeqCst), AT_ONCE);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_failure_in_order_wins_and_nothing_starts_after_it() {
        let started = AtomicUsize::new(0);
        let err = in_order(0..1000u64, |i| {
            let started = &started;
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                // 7 fails late, 9 fails early: 7 is reported.
                match i {
                    7 => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Err(i)
                    }
                    9 => Err(i),
                    _ => Ok(i),
                }
            }
        })
        .await
        .unwrap_err();
        assert_eq!(err, 7);
        // Started: up to 7 plus the window behind it, not the thousand.
        let n = started.load(Ordering::SeqCst);
        assert!(n <= 7 + AT_ONCE, "{n} started");
    }
}
