//! Which dead-lettered requests get an error reply, where it may go, and
//! what it may say.

use std::sync::Arc;

/// The prefix of a direct reply-to address as a server sees it (the broker
/// rewrites a caller's `amq.rabbitmq.reply-to` to
/// `amq.rabbitmq.reply-to.<token>`).
pub const DIRECT_REPLY_TO_PREFIX: &str = "amq.rabbitmq.reply-to.";

/// Which dead-lettered requests of a queue get an error reply.
///
/// A message's `reply_to` is the publisher's to choose: on a queue that
/// serves no requests, replying would let anyone who can publish there
/// make the service publish, under its own identity, to any queue. So:
/// - by default ([`ErrorReplies::none`]) no error reply is sent;
/// - a queue that serves requests ([`ErrorReplies::serving`], a queue's
///   `serves_requests: true`, or an `acemq` RPC server) replies only to
///   direct reply-to addresses (`amq.rabbitmq.reply-to.*`) and to the
///   addresses it names ([`also_to`](Self::also_to));
/// - the reply says only why (`x-acemq-reason`) with a generic text,
///   unless the queue opts in to the handler's error text
///   ([`error_text`](Self::error_text), `reply_error_text: true`).
///
/// ```
/// use acemq_layers::dead_letter::ErrorReplies;
///
/// let none = ErrorReplies::none();
/// assert!(!none.allows("amq.rabbitmq.reply-to.g1h2AA"));
/// let rpc = ErrorReplies::serving().also_to(["billing.replies"]);
/// assert!(rpc.allows("amq.rabbitmq.reply-to.g1h2AA"));
/// assert!(rpc.allows("billing.replies"));
/// assert!(!rpc.allows("shop.orders"));
/// assert!(!rpc.with_error_text());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorReplies {
    serving: bool,
    error_text: bool,
    addresses: Arc<[String]>,
}

impl ErrorReplies {
    /// No error reply (the default).
    pub fn none() -> Self {
        ErrorReplies::default()
    }

    /// A queue that serves requests: error replies to direct reply-to
    /// addresses, with a generic text.
    pub fn serving() -> Self {
        ErrorReplies {
            serving: true,
            ..ErrorReplies::default()
        }
    }

    /// Also reply to these addresses (queue names reached through the
    /// default exchange), besides direct reply-to ones.
    pub fn also_to<I, A>(mut self, addresses: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: Into<String>,
    {
        self.addresses = addresses.into_iter().map(Into::into).collect();
        self
    }

    /// Whether the reply carries the handler's error text (default `false`:
    /// a generic text; the reason is always there).
    pub fn error_text(mut self, error_text: bool) -> Self {
        self.error_text = error_text;
        self
    }

    /// Whether error replies are sent at all.
    pub fn is_serving(&self) -> bool {
        self.serving
    }

    /// Whether the reply carries the handler's error text.
    pub fn with_error_text(&self) -> bool {
        self.error_text
    }

    /// Whether an error reply may go to `reply_to`.
    pub fn allows(&self, reply_to: &str) -> bool {
        self.serving
            && ((reply_to.starts_with(DIRECT_REPLY_TO_PREFIX)
                && reply_to.len() > DIRECT_REPLY_TO_PREFIX.len())
                || self.addresses.iter().any(|a| a == reply_to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_that_serves_no_requests_replies_nowhere() {
        let none = ErrorReplies::none().also_to(["q"]).error_text(true);
        assert!(!none.allows("amq.rabbitmq.reply-to.abc"));
        assert!(!none.allows("q"));
    }

    #[test]
    fn a_serving_queue_replies_only_to_direct_reply_to_and_named_addresses() {
        let r = ErrorReplies::serving();
        assert!(r.allows("amq.rabbitmq.reply-to.g1h2AAA=="));
        assert!(!r.allows("amq.rabbitmq.reply-to."));
        assert!(!r.allows("amq.rabbitmq.reply-to"));
        assert!(!r.allows("victim.queue"));
        assert!(!r.allows(""));
        assert!(r.clone().also_to(["victim.queue"]).allows("victim.queue"));
    }
}
