//! What the drain does on every queue's consumer at once: `basic.cancel`,
//! then `channel.close`; and what a consumer loop still held.

use crate::sync::Locked;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use futures::future::join_all;
use lapin::options::BasicCancelOptions;
use tracing::warn;

use super::link::QueueHandle;
use crate::connection::{close_channel, CLOSE_BOUND};

/// `basic.cancel` on every consumer at once, within the deadline; what the
/// broker did not answer. Sets `hurried` if `hurry` resolves first; when
/// `hurried` is set already, `hurry` has resolved and is not polled again.
pub(super) async fn cancel_consumers<H: Future<Output = ()>>(
    queues: &[QueueHandle],
    deadline: tokio::time::Instant,
    hurry: Pin<&mut H>,
    hurried: &mut bool,
) -> Vec<String> {
    let unanswered: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let cancels = join_all(queues.iter().map(|q| {
        let unanswered = &unanswered;
        async move {
            let Some(channel) = q.channel.as_ref().filter(|c| c.status().connected()) else {
                return;
            };
            let cancel = channel
                .basic_cancel(q.consumer_tag.as_str().into(), BasicCancelOptions::default());
            let why = match tokio::time::timeout_at(deadline, cancel).await {
                Ok(Ok(())) => return,
                Ok(Err(e)) => {
                    warn!(queue = %q.name, error = %e, "basic.cancel failed; the channel close will stop the consumer");
                    format!("{}: basic.cancel was not answered ({e})", q.name)
                }
                Err(_) => format!("{}: the broker never answered basic.cancel", q.name),
            };
            unanswered
                .locked()
                .push(why);
        }
    }));
    // `hurry` may have resolved already (an earlier step took it): a
    // finished future is never polled again.
    let already = *hurried;
    tokio::select! {
        _ = cancels => {}
        () = hurry, if !already => *hurried = true,
    }
    unanswered.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// A queue whose consumer loops had not finished, with what they still
/// held.
pub(super) fn loops_not_finished(q: &QueueHandle) -> Option<String> {
    let loops = q.stats.loops.load(Ordering::Relaxed);
    let unsettled = q.stats.unsettled.load(Ordering::Relaxed);
    let buffered = q.stats.buffered.load(Ordering::Relaxed);
    (loops > 0).then(|| {
        format!(
            "{}: {loops} consumer loop(s) not finished, {unsettled} settle(s) not sent or not answered, {buffered} buffered",
            q.name
        )
    })
}

/// Each channel closed, all at once; those the broker did not answer
/// within [`CLOSE_BOUND`].
pub(super) async fn close_channels(queues: &[QueueHandle]) -> Vec<String> {
    let closes = join_all(queues.iter().map(|q| async move {
        let channel = q.channel.as_ref()?;
        if channel.status().connected()
            && close_channel(channel, "OK")
                .await
                .is_err_and(|e| e.is_unanswered())
        {
            return Some(format!(
                "{}: the broker did not answer channel.close within {CLOSE_BOUND:?}",
                q.name
            ));
        }
        None
    }))
    .await;
    let unanswered_close: Vec<String> = closes.into_iter().flatten().collect();
    unanswered_close
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use super::cancel_consumers;

    /// A second signal as `run` hands it on: ready once, and a panic if
    /// polled again after that (as a finished `async` block does).
    struct Once(bool);

    impl Future for Once {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            assert!(!self.0, "the finished hurry future was polled again");
            self.0 = true;
            Poll::Ready(())
        }
    }

    #[tokio::test]
    async fn a_hurry_that_resolved_before_is_not_polled_again() {
        // An earlier step took the second signal: `hurry` has finished and
        // `hurried` is set. `select!` polls its branches in a random order,
        // so before the guard the finished future was polled (a panic) about
        // every other time: 64 rounds make a pass by chance 2^-64.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        for _ in 0..64 {
            let mut hurry = std::pin::pin!(Once(false));
            hurry.as_mut().await;
            let mut hurried = true;
            let unanswered = cancel_consumers(&[], deadline, hurry.as_mut(), &mut hurried).await;
            assert!(unanswered.is_empty() && hurried);
        }
        // Not yet hurried: the signal still ends the wait.
        let mut hurry = std::pin::pin!(Once(false));
        let mut hurried = false;
        cancel_consumers(&[], deadline, hurry.as_mut(), &mut hurried).await;
    }
}
