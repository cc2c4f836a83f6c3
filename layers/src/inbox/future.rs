//! The response future of [`Inbox`](super::Inbox).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use pin_project_lite::pin_project;
use tower::Service;

use super::{Begun, InboxOutcome, InboxStore};
use crate::delivery::Delivery;
use crate::error::BoxError;

pin_project! {
    /// Response future of [`Inbox`](super::Inbox): begin (mark), call the
    /// handler, commit. Nothing is boxed here.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<S, St>
    where
        S: Service<Delivery>,
        St: InboxStore,
    {
        #[pin]
        state: State<S, St>,
        store: Option<St>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, St>
    where
        S: Service<Delivery>,
        St: InboxStore,
    {
        Begin {
            #[pin]
            future: St::BeginFuture,
            inner: Option<S>,
            request: Option<Delivery>,
        },
        Call {
            #[pin]
            future: S::Future,
            transaction: Option<St::Transaction>,
        },
        Commit {
            #[pin]
            future: St::CommitFuture,
            response: Option<S::Response>,
        },
        Rejected {
            error: Option<BoxError>,
        },
    }
}

impl<S, St> ResponseFuture<S, St>
where
    S: Service<Delivery>,
    St: InboxStore,
{
    pub(crate) fn new(begin: St::BeginFuture, inner: S, request: Delivery, store: St) -> Self {
        ResponseFuture {
            state: State::Begin {
                future: begin,
                inner: Some(inner),
                request: Some(request),
            },
            store: Some(store),
        }
    }

    pub(crate) fn rejected(error: BoxError) -> Self {
        ResponseFuture {
            state: State::Rejected { error: Some(error) },
            store: None,
        }
    }
}

impl<S, St> Future for ResponseFuture<S, St>
where
    S: Service<Delivery>,
    S::Error: Into<BoxError>,
    St: InboxStore,
{
    type Output = Result<InboxOutcome<S::Response>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Begin {
                    future,
                    inner,
                    request,
                } => {
                    let begun = ready!(future.poll(cx)).map_err(Into::into)?;
                    let mut request = request.take().expect("polled after completion");
                    let transaction = match begun {
                        Begun::Fresh(t) => t,
                        Begun::Duplicate => {
                            metrics::counter!("acemq.inbox.duplicates", "queue" => request.queue().to_owned())
                                .increment(1);
                            super::count::count_duplicate(request.queue());
                            tracing::debug!(
                                queue = request.queue(),
                                message_id = request.properties().message_id.as_deref(),
                                "already processed: acknowledged without calling the handler"
                            );
                            this.store.take();
                            return Poll::Ready(Ok(InboxOutcome::Duplicate));
                        }
                    };
                    request.extensions_mut().insert(transaction.clone());
                    let mut inner = inner.take().expect("polled after completion");
                    let future = inner.call(request);
                    this.state.set(State::Call {
                        future,
                        transaction: Some(transaction),
                    });
                }
                StateProj::Call {
                    future,
                    transaction,
                } => {
                    // An error drops the transaction uncommitted: the work
                    // and the mark are rolled back together.
                    let response = ready!(future.poll(cx)).map_err(Into::into)?;
                    let transaction = transaction.take().expect("polled after completion");
                    let store = this.store.take().expect("polled after completion");
                    let future = store.commit(transaction);
                    this.state.set(State::Commit {
                        future,
                        response: Some(response),
                    });
                }
                StateProj::Commit { future, response } => {
                    ready!(future.poll(cx)).map_err(Into::into)?;
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(InboxOutcome::Handled(response)));
                }
                StateProj::Rejected { error } => {
                    return Poll::Ready(Err(error.take().expect("polled after completion")));
                }
            }
        }
    }
}

impl<S, St> fmt::Debug for ResponseFuture<S, St>
where
    S: Service<Delivery>,
    St: InboxStore,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Begin { .. } => "begin",
            State::Call { .. } => "call",
            State::Commit { .. } => "commit",
            State::Rejected { .. } => "rejected",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
