//! Errors and their classification: is a failure worth retrying?

use std::error::Error as StdError;
use std::fmt;

/// The boxed error the failure-aware layers use.
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Marks a handler's failure as permanent: it is dead-lettered at once with
/// reason `rejected`, never retried.
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
    source: BoxError,
}

impl Reject {
    /// Wraps an error (or a message) as permanent.
    pub fn new(source: impl Into<BoxError>) -> Self {
        Reject {
            source: source.into(),
        }
    }
    /// The wrapped error.
    pub fn into_inner(self) -> BoxError {
        self.source
    }
}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rejected: {}", self.source)
    }
}

impl StdError for Reject {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
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
pub enum Class {
    /// Worth retrying on the schedule.
    Transient,
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

/// The default classification: a [`HandlerPanic`] anywhere in the chain is
/// `Panic`, a [`Reject`] anywhere in the chain is `Permanent`, everything
/// else is `Transient`.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultClassifier;

impl Classify for DefaultClassifier {
    fn classify(&self, error: &(dyn StdError + 'static)) -> Class {
        let mut cur: Option<&(dyn StdError + 'static)> = Some(error);
        while let Some(e) = cur {
            if e.is::<HandlerPanic>() {
                return Class::Panic;
            }
            if e.is::<Reject>() {
                return Class::Permanent;
            }
            cur = e.source();
        }
        Class::Transient
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
