//! Errors and their classification: is a failure worth retrying?

use std::error::Error as StdError;
use std::fmt;

/// The boxed error the failure-aware layers use.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Marks a handler's failure as permanent: it is dead-lettered at once with
/// reason `rejected`, never retried.
///
/// It is recognised wherever it sits in the error: returned as is, boxed
/// (once or twice: `Box<Reject>` into a [`BoxError`]), reachable through
/// [`source()`](StdError::source), behind `thiserror`'s
/// `#[error(transparent)]`, or inside an `anyhow::Error`
/// (`anyhow::Error::new(reject)`, `anyhow!(reject)`, `.context(..)`) — see
/// [`DefaultClassifier`].
///
/// ```
/// use acemq_layers::Reject;
/// fn parse(body: &[u8]) -> Result<u64, Reject> {
///     std::str::from_utf8(body)
///         .ok()
///         .and_then(|s| s.parse().ok())
///         .ok_or_else(|| Reject::new("body is not a number"))
/// }
/// assert!(parse(b"x").is_err());
/// ```
#[derive(Debug)]
pub struct Reject {
    source: Rejected,
}

/// What a [`Reject`] wraps, as its [`source()`](StdError::source): the
/// wrapped error under a type of its own, so that a wrapper which forwards
/// to the `Reject`'s source and hides the `Reject` itself (`thiserror`'s
/// `#[error(transparent)]`, `anyhow::Error`, `Box<Reject>`) still leaves a
/// mark the classifier finds. Displays as the wrapped error.
#[derive(Debug)]
struct Rejected(BoxError);

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl StdError for Rejected {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

impl Reject {
    /// Wraps an error (or a message) as permanent.
    pub fn new(source: impl Into<BoxError>) -> Self {
        Reject {
            source: Rejected(source.into()),
        }
    }
    /// The wrapped error.
    pub fn into_inner(self) -> BoxError {
        self.source.0
    }
    /// Whether `error` is a `Reject` or carries one anywhere in its
    /// [`source()`](StdError::source) chain, whatever wraps it (see the
    /// type's docs).
    pub fn is_in(error: &(dyn StdError + 'static)) -> bool {
        chain(error).any(|e| {
            e.is::<Reject>()
                || e.is::<Rejected>()
                || e.is::<Box<Reject>>()
                || e.is::<Box<Box<Reject>>>()
        })
    }
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rejected: {}", self.source)
    }
}

impl StdError for Reject {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.source)
    }
}

/// `error`, then each of its sources in turn.
fn chain<'a>(
    error: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(error), |e: &&'a (dyn StdError + 'static)| {
        (*e).source()
    })
}

/// Whether `error` is a timeout from tower (`tower::timeout::error::Elapsed`,
/// what `tower::timeout::TimeoutLayer` fails with) or tokio
/// (`tokio::time::error::Elapsed`, what `tokio::time::timeout` fails with)
/// anywhere in its source chain.
pub fn is_timeout(error: &(dyn StdError + 'static)) -> bool {
    chain(error)
        .any(|e| e.is::<tower::timeout::error::Elapsed>() || e.is::<tokio::time::error::Elapsed>())
}

/// A handler panicked; carries the panic message.
#[derive(Debug)]
pub struct HandlerPanic {
    message: String,
}

impl HandlerPanic {
    /// Builds the error from a caught panic payload.
    pub fn from_payload(payload: &(dyn std::any::Any + Send)) -> Self {
        let message = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_owned()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "non-string panic payload".to_owned()
        };
        HandlerPanic { message }
    }
    /// The panic message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for HandlerPanic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "handler panicked: {}", self.message)
    }
}

impl StdError for HandlerPanic {}

/// How a failure is treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Class {
    /// Worth retrying on the schedule.
    Transient,
    /// The handler did not finish in time (a tower or tokio timeout): retried
    /// on the schedule like a transient failure, and dead-lettered with
    /// reason `timeout` (not `max-attempts`) once the attempts run out.
    Timeout,
    /// Dead-letter at once with reason `rejected`.
    Permanent,
    /// A bug: dead-letter at once with reason `panic` (unless configured to retry).
    Panic,
}

/// Decides whether a failure is transient or permanent; the retry and
/// dead-letter layers act on the answer.
pub trait Classify: Send + Sync + 'static {
    /// Classifies `error`.
    fn classify(&self, error: &(dyn StdError + 'static)) -> Class;
}

impl<F> Classify for F
where
    F: Fn(&(dyn StdError + 'static)) -> Class + Send + Sync + 'static,
{
    fn classify(&self, error: &(dyn StdError + 'static)) -> Class {
        self(error)
    }
}

/// The default classification, by what the error is, not how it is
/// wrapped: a [`HandlerPanic`] anywhere in the source chain is `Panic`; a
/// [`Reject`] anywhere in it is `Permanent` — also boxed, behind
/// `#[error(transparent)]` and inside an `anyhow::Error` (see
/// [`Reject::is_in`]); a tower or tokio timeout ([`is_timeout`]) is
/// `Timeout`; everything else is `Transient`.
///
/// ```
/// use acemq_layers::{BoxError, Class, Classify, DefaultClassifier, Reject};
///
/// #[derive(Debug, thiserror::Error)]
/// enum AppError {
///     #[error(transparent)]
///     Invalid(#[from] Reject),
/// }
///
/// let wrapped: BoxError = AppError::from(Reject::new("not an order")).into();
/// assert_eq!(DefaultClassifier.classify(&*wrapped), Class::Permanent);
/// let boxed: BoxError = Box::new(Reject::new("not an order")).into();
/// assert_eq!(DefaultClassifier.classify(&*boxed), Class::Permanent);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultClassifier;

impl Classify for DefaultClassifier {
    fn classify(&self, error: &(dyn StdError + 'static)) -> Class {
        if chain(error).any(|e| e.is::<HandlerPanic>()) {
            Class::Panic
        } else if Reject::is_in(error) {
            Class::Permanent
        } else if is_timeout(error) {
            Class::Timeout
        } else {
            Class::Transient
        }
    }
}

/// The error's display chain (`outer: inner: innermost`), at most `max`
/// bytes (cut on a character boundary, with `…` when cut).
pub fn display_chain(error: &(dyn StdError + 'static), max: usize) -> String {
    let mut out = error.to_string();
    let mut cur = error.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !out.ends_with(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    if out.len() > max {
        let mut cut = max.saturating_sub('…'.len_utf8());
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}
