//! The response future of [`RedeliveryLimit`](super::RedeliveryLimit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;

use crate::decision::Decision;

pin_project! {
    /// Response future of [`RedeliveryLimit`](super::RedeliveryLimit): the
    /// inner future, or the dead-letter decision at once.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Inner {
            #[pin]
            future: F,
        },
        Limited {
            decision: Option<Decision>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn inner(future: F) -> Self {
        ResponseFuture {
            state: State::Inner { future },
        }
    }

    pub(crate) fn limited(decision: Decision) -> Self {
        ResponseFuture {
            state: State::Limited {
                decision: Some(decision),
            },
        }
    }
}

impl<F, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Decision, E>>,
{
    type Output = Result<Decision, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future } => future.poll(cx),
            StateProj::Limited { decision } => Poll::Ready(Ok(decision
                .take()
                .expect("redelivery::ResponseFuture polled after completion"))),
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Inner { .. } => "inner",
            State::Limited { .. } => "limited",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
