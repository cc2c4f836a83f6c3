//! [`Slots`]: a transport's running requests, each polled with a waker made
//! once per slot, so that the transport can wake them all.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use pin_project_lite::pin_project;

mod wakers;

use wakers::Wakers;

pin_project! {
    #[project = CellProj]
    enum Cell<F> {
        Empty,
        Running { #[pin] fut: F },
    }
}

/// A transport's running requests (acemq's consumer loop keeps its
/// handlers in one), for a cancellation layer that is
/// [`woken_by_transport`](super::CancelLayer::woken_by_transport).
///
/// Like `FuturesUnordered`, a [`Stream`] of the outputs of the futures
/// pushed into it, polled only when woken. Unlike it, a future runs in a
/// slot whose waker was made with the slot: a request costs no allocation
/// and no reference count (a slot is reused; slots are added only when
/// more run at once than ever before), and [`wake_all`](Self::wake_all)
/// reaches every running request without each keeping a waker of its own
/// (what [`Wakeable`](super::Wakeable) does for a transport that polls its
/// requests elsewhere). Call `wake_all` once the requests' root token is
/// cancelled: each running request is polled again and its layer sees the
/// cancellation; a request pushed after that is polled once more after its
/// first `Pending`, so its layer sees it too.
///
/// A waker outliving its request (a timer that fires after the request
/// finished) may poll the slot's next request once more than needed, which
/// a future must tolerate anyway.
///
/// ```
/// use std::time::Duration;
/// use acemq_layers::cancel::Slots;
/// use acemq_layers::{CancelLayer, Decision, Delivery};
/// use futures::StreamExt;
/// use tokio_util::sync::CancellationToken;
/// use tower::{Service, ServiceBuilder, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let root = CancellationToken::new();
/// let mut svc = ServiceBuilder::new()
///     .layer(CancelLayer::new(root.clone()).woken_by_transport().abandon_after(Duration::ZERO))
///     .service_fn(|_: Delivery| std::future::pending::<Result<(), std::io::Error>>());
/// let mut running = Slots::new();
/// running.push(svc.ready().await.unwrap().call(Delivery::builder().build()));
/// // ... the transport stops: it cancels the root and wakes every request.
/// root.cancel();
/// running.wake_all();
/// let decision = running.next().await.unwrap().unwrap();
/// assert_eq!(decision, Decision::Abandoned);
/// # }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct Slots<F> {
    cells: Vec<Pin<Box<Cell<F>>>>,
    wakers: Wakers,
    free: Vec<usize>,
    len: usize,
    woken_all: bool,
}

impl<F> Slots<F> {
    /// An empty set; slots are added as requests are pushed.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An empty set with `n` slots made ahead (a transport's concurrency).
    pub fn with_capacity(n: usize) -> Self {
        let mut slots = Slots {
            cells: Vec::with_capacity(n),
            wakers: Wakers::with_capacity(n),
            free: Vec::with_capacity(n),
            len: 0,
            woken_all: false,
        };
        for _ in 0..n {
            let i = slots.add_slot();
            slots.free.push(i);
        }
        // Reused last-in first-out: hand out the lowest slots first.
        slots.free.reverse();
        slots
    }

    /// How many requests are running.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no request is running.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Starts running `fut` in a free slot (made if none is free). Like
    /// `FuturesUnordered::push`, it does not poll it: the next
    /// [`poll_next`](Stream::poll_next) does.
    pub fn push(&mut self, fut: F) {
        let i = match self.free.pop() {
            Some(i) => i,
            None => self.add_slot(),
        };
        self.cells[i].as_mut().set(Cell::Running { fut });
        self.len += 1;
        self.wakers.mark(i);
        // A free slot's nudge bit is clear (cleared when its last request
        // finished).
        if self.woken_all {
            self.wakers.nudge(i);
        }
    }

    /// Polls every running request again at the next
    /// [`poll_next`](Stream::poll_next), and from now on each request
    /// pushed once more after its first `Pending`. Call it once the
    /// requests' root token is cancelled; the caller polls next.
    pub fn wake_all(&mut self) {
        self.woken_all = true;
        for (i, cell) in self.cells.iter().enumerate() {
            if matches!(cell.as_ref().get_ref(), Cell::Running { .. }) {
                self.wakers.mark(i);
                // One pushed but not polled yet meets the cancellation in
                // its first poll, which a layer woken by its transport
                // answers `Pending` without asking the token: poll it once
                // more, as one pushed from now on.
                self.wakers.nudge(i);
            }
        }
    }

    fn add_slot(&mut self) -> usize {
        let i = self.cells.len();
        debug_assert_eq!(i, self.wakers.len());
        self.wakers.add();
        self.cells.push(Box::pin(Cell::Empty));
        i
    }
}

impl<F> Default for Slots<F> {
    fn default() -> Self {
        Self::new()
    }
}

impl<F: Future> Stream for Slots<F> {
    type Item = F::Output;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        let this = self.get_mut();
        if this.len == 0 {
            return Poll::Ready(None);
        }
        // Registered before the bits are read: a wake after this wakes us.
        // The woken bits are taken once per call, first: a request that
        // wakes itself in its poll is polled again in the next call.
        this.wakers.register_and_take_woken(cx.waker());
        loop {
            let Some(i) = this.wakers.next_marked() else {
                return Poll::Pending;
            };
            let mut cell = this.cells[i].as_mut();
            // A wake left over from the slot's previous request: nothing
            // runs there now.
            let CellProj::Running { fut } = cell.as_mut().project() else {
                continue;
            };
            match fut.poll(&mut Context::from_waker(this.wakers.get(i))) {
                Poll::Ready(out) => {
                    cell.set(Cell::Empty);
                    this.free.push(i);
                    this.len -= 1;
                    this.wakers.take_nudge(i);
                    return Poll::Ready(Some(out));
                }
                Poll::Pending => {
                    if this.wakers.take_nudge(i) {
                        this.wakers.get(i).wake_by_ref();
                    }
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.len, Some(self.len))
    }
}

impl<F> fmt::Debug for Slots<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slots")
            .field("running", &self.len)
            .field("slots", &self.cells.len())
            .field("woken_all", &self.woken_all)
            .finish_non_exhaustive()
    }
}

// Not in the model-checking build: these run on tokio and std, outside loom.
#[cfg(all(test, not(acemq_loom)))]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Waker;

    // Pending until told; counts its polls.
    struct Gate {
        open: Arc<std::sync::atomic::AtomicBool>,
        polls: Arc<AtomicUsize>,
        waker: Arc<std::sync::Mutex<Option<Waker>>>,
        id: usize,
    }

    impl Future for Gate {
        type Output = usize;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            if self.open.load(Ordering::SeqCst) {
                return Poll::Ready(self.id);
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    type Handle = (
        Arc<std::sync::atomic::AtomicBool>,
        Arc<AtomicUsize>,
        Arc<std::sync::Mutex<Option<Waker>>>,
    );

    fn gate(id: usize) -> (Gate, Handle) {
        let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let polls = Arc::new(AtomicUsize::new(0));
        let waker = Arc::new(std::sync::Mutex::new(None));
        (
            Gate {
                open: open.clone(),
                polls: polls.clone(),
                waker: waker.clone(),
                id,
            },
            (open, polls, waker),
        )
    }

    fn open(h: &Handle) {
        h.0.store(true, Ordering::SeqCst);
        if let Some(w) = h.2.lock().unwrap().take() {
            w.wake();
        }
    }

    fn poll<F: Future>(s: &mut Slots<F>) -> Poll<Option<F::Output>> {
        s.poll_next_unpin(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn polls_a_pushed_future_and_only_woken_ones_after() {
        let mut s = Slots::new();
        let (a, ha) = gate(1);
        let (b, hb) = gate(2);
        s.push(a);
        s.push(b);
        assert!(poll(&mut s).is_pending());
        assert_eq!(
            (ha.1.load(Ordering::SeqCst), hb.1.load(Ordering::SeqCst)),
            (1, 1)
        );
        // Nothing woke: nothing is polled.
        assert!(poll(&mut s).is_pending());
        assert_eq!(
            (ha.1.load(Ordering::SeqCst), hb.1.load(Ordering::SeqCst)),
            (1, 1)
        );
        open(&hb);
        assert_eq!(poll(&mut s), Poll::Ready(Some(2)));
        assert_eq!(ha.1.load(Ordering::SeqCst), 1, "a was not woken");
        assert_eq!(s.len(), 1);
        open(&ha);
        assert_eq!(poll(&mut s), Poll::Ready(Some(1)));
        assert_eq!(poll(&mut s), Poll::Ready(None));
        assert!(s.is_empty());
    }

    #[test]
    fn reuses_slots_and_grows_past_sixty_four() {
        let mut s = Slots::with_capacity(2);
        let mut handles = Vec::new();
        for id in 0..150 {
            let (g, h) = gate(id);
            s.push(g);
            handles.push(h);
        }
        assert!(poll(&mut s).is_pending());
        assert_eq!(s.len(), 150);
        for h in handles.iter().rev() {
            open(h);
        }
        let mut seen: Vec<usize> = std::iter::from_fn(|| match poll(&mut s) {
            Poll::Ready(Some(id)) => Some(id),
            _ => None,
        })
        .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..150).collect::<Vec<_>>());
        // The slots are reused: pushing as many again makes none.
        let made = s.cells.len();
        let mut again = Vec::new();
        for id in 0..150 {
            let (g, h) = gate(id);
            open(&h);
            s.push(g);
            again.push(h);
        }
        assert_eq!(s.cells.len(), made);
        assert_eq!(futures::executor::block_on(s.by_ref().count()), 150);
    }

    #[test]
    fn wake_all_polls_every_running_one_and_nudges_later_ones_once() {
        let mut s = Slots::new();
        let (a, ha) = gate(1);
        s.push(a);
        assert!(poll(&mut s).is_pending());
        s.wake_all();
        assert!(poll(&mut s).is_pending());
        assert_eq!(ha.1.load(Ordering::SeqCst), 2, "woken by wake_all");
        // ... and once more after that (it may not have been polled yet).
        assert!(poll(&mut s).is_pending());
        assert_eq!(ha.1.load(Ordering::SeqCst), 3);
        let (b, hb) = gate(2);
        s.push(b);
        assert!(poll(&mut s).is_pending());
        assert_eq!(hb.1.load(Ordering::SeqCst), 1);
        // Its first Pending woke it once more: polled again, then not.
        assert!(poll(&mut s).is_pending());
        assert_eq!(hb.1.load(Ordering::SeqCst), 2);
        assert!(poll(&mut s).is_pending());
        assert_eq!(hb.1.load(Ordering::SeqCst), 2);
        assert_eq!(ha.1.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn one_pushed_before_wake_all_and_first_polled_after_it_is_polled_once_more() {
        let mut s = Slots::new();
        let (a, ha) = gate(1);
        s.push(a);
        s.wake_all();
        assert!(poll(&mut s).is_pending());
        assert!(poll(&mut s).is_pending());
        assert!(poll(&mut s).is_pending());
        assert_eq!(ha.1.load(Ordering::SeqCst), 2);
    }

    // The race the nudge covers, with the layer itself: the handler is
    // pushed, the root cancelled and everything woken before its first
    // poll; it never wakes on its own, and must still be abandoned.
    #[tokio::test]
    async fn a_handler_first_polled_after_the_cancel_is_abandoned() {
        use crate::{CancelLayer, Decision, Delivery};
        use tokio_util::sync::CancellationToken;
        use tower::{Service, ServiceBuilder, ServiceExt};
        let root = CancellationToken::new();
        let mut svc = ServiceBuilder::new()
            .layer(
                CancelLayer::new(root.clone())
                    .woken_by_transport()
                    .abandon_after(std::time::Duration::ZERO),
            )
            .service_fn(|_: Delivery| std::future::pending::<Result<(), std::io::Error>>());
        let mut running = Slots::new();
        running.push(svc.ready().await.unwrap().call(Delivery::builder().build()));
        root.cancel();
        running.wake_all();
        let decision = tokio::time::timeout(std::time::Duration::from_secs(10), running.next())
            .await
            .expect("abandoned, not left waiting");
        assert_eq!(decision.unwrap().unwrap(), Decision::Abandoned);
    }

    #[test]
    fn a_wake_from_another_thread_wakes_the_owner() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut s = Slots::new();
            let (a, ha) = gate(7);
            s.push(a);
            let opener = std::thread::spawn(move || {
                // Wait (bounded) until the request has been polled once.
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while ha.2.lock().unwrap().is_none() {
                    assert!(std::time::Instant::now() < deadline, "never polled");
                    std::thread::yield_now();
                }
                open(&ha);
            });
            let out = tokio::time::timeout(std::time::Duration::from_secs(10), s.next())
                .await
                .expect("the wake reached the owner");
            assert_eq!(out, Some(7));
            opener.join().unwrap();
        });
    }

    #[test]
    fn a_request_waking_itself_is_polled_again_in_the_next_call_not_this_one() {
        struct Spin(Arc<AtomicUsize>);
        impl Future for Spin {
            type Output = ();
            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                self.0.fetch_add(1, Ordering::SeqCst);
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
        let polls = Arc::new(AtomicUsize::new(0));
        let mut s = Slots::new();
        s.push(Spin(polls.clone()));
        assert!(poll(&mut s).is_pending());
        assert!(poll(&mut s).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_stale_wake_polls_the_next_request_harmlessly() {
        let mut s = Slots::new();
        let (a, ha) = gate(1);
        s.push(a);
        assert!(poll(&mut s).is_pending());
        let stale = ha.2.lock().unwrap().clone().unwrap();
        open(&ha);
        assert_eq!(poll(&mut s), Poll::Ready(Some(1)));
        let (b, hb) = gate(2);
        s.push(b);
        assert!(poll(&mut s).is_pending());
        stale.wake();
        assert!(poll(&mut s).is_pending());
        assert_eq!(hb.1.load(Ordering::SeqCst), 2, "one extra poll, no harm");
        open(&hb);
        assert_eq!(poll(&mut s), Poll::Ready(Some(2)));
    }
}
