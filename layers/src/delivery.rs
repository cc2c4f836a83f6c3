//! The request type every layer handles: one message taken from a queue.

use std::sync::Arc;

use bytes::Bytes;
use http::Extensions;

use crate::lifeline::{Cancellation, ClaimCell, Lifeline};
use crate::permit::PermitCell;
use crate::sync::CancellationToken;

use crate::headers::{Headers, Value};

/// Header that carries the attempt number of a message (1 for the first).
pub const ATTEMPT_HEADER: &str = "x-acemq-attempt";

/// The largest attempt number accepted from a header. Anything above is
/// treated as malformed: no real schedule retries a million times.
pub const MAX_ATTEMPT: u32 = 1_000_000;

/// AMQP basic properties other than headers, kept so a republished copy
/// (retry rung, dead-letter queue) carries the original's properties.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Properties {
    /// MIME content type.
    pub content_type: Option<String>,
    /// MIME content encoding.
    pub content_encoding: Option<String>,
    /// 1 = transient, 2 = persistent.
    pub delivery_mode: Option<u8>,
    /// Message priority.
    pub priority: Option<u8>,
    /// Correlation identifier.
    pub correlation_id: Option<String>,
    /// Address to reply to.
    pub reply_to: Option<String>,
    /// Per-message TTL, as the AMQP string.
    pub expiration: Option<String>,
    /// Application message identifier.
    pub message_id: Option<String>,
    /// Timestamp, seconds since the Unix epoch.
    pub timestamp: Option<u64>,
    /// Message type name.
    pub kind: Option<String>,
    /// Creating user id.
    pub user_id: Option<String>,
    /// Creating application id.
    pub app_id: Option<String>,
}

/// The immutable part of a delivery, shared (not copied) between the
/// handler, retries and republished copies.
#[derive(Default, Clone)]
struct Message {
    exchange: String,
    routing_key: String,
    body: Bytes,
    headers: Headers,
    properties: Properties,
}

/// The body's length, never its bytes: a `Delivery` logged with `?` must not
/// leak what the message says.
impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("body", &format_args!("<{} bytes>", self.body.len()))
            .field("headers", &self.headers)
            .field("properties", &self.properties)
            .finish()
    }
}

/// One message delivered from a queue: the request of every acemq layer.
///
/// Cloning is cheap (reference counts only): the body, headers and properties
/// are shared. The attempt number and cancellation token are per delivery.
#[derive(Debug, Clone)]
pub struct Delivery {
    // What every copy of this delivery shares: one reference count for the
    // lot, so a clone (the retry and dead-letter layers keep one each) is
    // one atomic increment, plus one for a token once the cancellation layer
    // has set it.
    shared: Arc<Shared>,
    attempt: u32,
    // `None`: one that never fires (no reference count to touch).
    token: Option<Cancellation>,
    extensions: Extensions,
}

/// The part of a delivery that is the same for every copy and attempt.
#[derive(Debug, Clone)]
struct Shared {
    message: Message,
    queue: Arc<str>,
    delivery_tag: u64,
    redelivered: bool,
    lifeline: Lifeline,
    claim: ClaimCell,
    // The concurrency permit the claim took, while the delivery keeps it
    // (see the in-flight module's docs, "Confirming").
    permit: PermitCell,
}

/// Builds a [`Delivery`]; used by the transport binding, tests and benches.
#[derive(Debug, Default)]
pub struct DeliveryBuilder {
    message: Message,
    queue: Option<Arc<str>>,
    delivery_tag: u64,
    redelivered: bool,
    token: Option<Cancellation>,
    lifeline: Option<Lifeline>,
}

impl DeliveryBuilder {
    /// The queue the delivery came from.
    #[inline]
    pub fn queue(mut self, queue: impl Into<Arc<str>>) -> Self {
        self.queue = Some(queue.into());
        self
    }
    /// The message body.
    #[inline]
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.message.body = body.into();
        self
    }
    /// The message headers (the attempt is parsed from them).
    #[inline]
    pub fn headers(mut self, headers: Headers) -> Self {
        self.message.headers = headers;
        self
    }
    /// The message properties.
    #[inline]
    pub fn properties(mut self, properties: Properties) -> Self {
        self.message.properties = properties;
        self
    }
    /// The exchange the message was published to (empty: default exchange).
    #[inline]
    pub fn exchange(mut self, exchange: impl Into<String>) -> Self {
        self.message.exchange = exchange.into();
        self
    }
    /// The routing key the message was published with.
    #[inline]
    pub fn routing_key(mut self, routing_key: impl Into<String>) -> Self {
        self.message.routing_key = routing_key.into();
        self
    }
    /// The broker's delivery tag.
    #[inline]
    pub fn delivery_tag(mut self, tag: u64) -> Self {
        self.delivery_tag = tag;
        self
    }
    /// Whether the broker flagged the message as redelivered.
    #[inline]
    pub fn redelivered(mut self, redelivered: bool) -> Self {
        self.redelivered = redelivered;
        self
    }
    /// The cancellation the handler sees (default: one that never fires).
    #[inline]
    pub fn token(mut self, token: CancellationToken) -> Self {
        self.token = Some(Cancellation::new(token));
        self
    }
    /// The delivery's [`Lifeline`] (default: one that is never lost).
    #[inline]
    pub fn lifeline(mut self, lifeline: Lifeline) -> Self {
        self.lifeline = Some(lifeline);
        self
    }
    /// Builds the delivery, parsing the attempt from [`ATTEMPT_HEADER`].
    #[inline]
    pub fn build(self) -> Delivery {
        Delivery::assemble(
            self.message,
            self.queue.unwrap_or_else(|| Arc::from("")),
            self.delivery_tag,
            self.redelivered,
            self.lifeline.unwrap_or_default(),
            self.token,
        )
    }
}

/// Everything a transport received with one message, for
/// [`Delivery::received`]: the builder's result in one step, for the
/// transport's path that runs once per message (each of the builder's
/// chained calls moves the whole message).
#[doc(hidden)]
pub struct Received {
    pub queue: Arc<str>,
    pub exchange: String,
    pub routing_key: String,
    pub body: Bytes,
    pub headers: Headers,
    pub properties: Properties,
    pub delivery_tag: u64,
    pub redelivered: bool,
    pub lifeline: Lifeline,
}

/// Never the body (see [`Message`]'s).
impl std::fmt::Debug for Received {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received")
            .field("queue", &self.queue)
            .field("delivery_tag", &self.delivery_tag)
            .field("body_len", &self.body.len())
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// What [`DeliveryBuilder`] builds from the same parts (no token: one
    /// that never fires), less the `x-acemq-original-*` headers where the
    /// broker does not vouch for them ([`provenance`](crate::provenance)).
    #[doc(hidden)]
    #[inline]
    pub fn received(mut r: Received) -> Delivery {
        crate::provenance::strip_unbelieved(&mut r.headers, &r.queue, &r.exchange, &r.routing_key);
        Delivery::assemble(
            Message {
                exchange: r.exchange,
                routing_key: r.routing_key,
                body: r.body,
                headers: r.headers,
                properties: r.properties,
            },
            r.queue,
            r.delivery_tag,
            r.redelivered,
            r.lifeline,
            None,
        )
    }

    /// The one place a delivery is put together: the attempt parsed from
    /// [`ATTEMPT_HEADER`], the shared part built in place.
    #[inline]
    fn assemble(
        message: Message,
        queue: Arc<str>,
        delivery_tag: u64,
        redelivered: bool,
        lifeline: Lifeline,
        token: Option<Cancellation>,
    ) -> Delivery {
        let attempt = match parse_attempt(message.headers.get(ATTEMPT_HEADER)) {
            Ok(n) => n,
            Err(why) => malformed_attempt(&queue, delivery_tag, &why),
        };
        Delivery {
            shared: Arc::new(Shared {
                message,
                queue,
                delivery_tag,
                redelivered,
                lifeline,
                claim: ClaimCell::new(),
                permit: PermitCell::default(),
            }),
            attempt,
            token,
            extensions: Extensions::new(),
        }
    }
}

/// Says that the attempt header was malformed; the delivery is attempt 1.
#[cold]
fn malformed_attempt(queue: &str, delivery_tag: u64, why: &str) -> u32 {
    tracing::warn!(
        queue = %queue,
        delivery_tag,
        "malformed {ATTEMPT_HEADER} header ({why}); treating the delivery as attempt 1"
    );
    1
}

/// Parses the attempt header: absent is attempt 1; anything but an integer in
/// `1..=MAX_ATTEMPT` is an error describing what was wrong.
pub fn parse_attempt(value: Option<&Value>) -> Result<u32, String> {
    let Some(value) = value else { return Ok(1) };
    match value.as_i64() {
        Some(n) if n >= 1 && n <= i64::from(MAX_ATTEMPT) => Ok(n as u32),
        Some(n) if n < 1 => Err(format!("{n} is not a positive attempt number")),
        Some(n) => Err(format!("{n} is larger than {MAX_ATTEMPT}")),
        None => Err(format!(
            "expected an integer, found a {}",
            value.type_name()
        )),
    }
}

impl Delivery {
    /// Starts building a delivery.
    #[inline]
    pub fn builder() -> DeliveryBuilder {
        DeliveryBuilder::default()
    }

    /// The message body.
    pub fn body(&self) -> &Bytes {
        &self.shared.message.body
    }
    /// The message headers, as received.
    pub fn headers(&self) -> &Headers {
        &self.shared.message.headers
    }
    /// The message properties other than headers.
    pub fn properties(&self) -> &Properties {
        &self.shared.message.properties
    }
    /// The queue the delivery came from.
    pub fn queue(&self) -> &str {
        &self.shared.queue
    }
    /// The queue name as a shared string (cheap to clone).
    pub fn queue_arc(&self) -> &Arc<str> {
        &self.shared.queue
    }
    /// The exchange the message was published to (empty: the default exchange).
    pub fn exchange(&self) -> &str {
        &self.shared.message.exchange
    }
    /// The routing key the message was published with.
    pub fn routing_key(&self) -> &str {
        &self.shared.message.routing_key
    }
    /// The exchange the message was first published to, on every attempt:
    /// from attempt 2 on a copy comes back from a rung through the default
    /// exchange, and this reads its
    /// [`ORIGINAL_EXCHANGE_HEADER`](crate::headers::ORIGINAL_EXCHANGE_HEADER);
    /// otherwise (and if the header is not a string) [`exchange`](Self::exchange).
    /// A publisher's own header is not believed on a first delivery
    /// ([`provenance`](crate::provenance)); do not authorise on it.
    pub fn original_exchange(&self) -> &str {
        self.header_str(crate::headers::ORIGINAL_EXCHANGE_HEADER)
            .unwrap_or(&self.shared.message.exchange)
    }
    /// The routing key the message was first published with, on every
    /// attempt (see [`original_exchange`](Self::original_exchange)); from
    /// [`ORIGINAL_ROUTING_KEY_HEADER`](crate::headers::ORIGINAL_ROUTING_KEY_HEADER),
    /// else [`routing_key`](Self::routing_key).
    pub fn original_routing_key(&self) -> &str {
        self.header_str(crate::headers::ORIGINAL_ROUTING_KEY_HEADER)
            .unwrap_or(&self.shared.message.routing_key)
    }
    fn header_str(&self, name: &str) -> Option<&str> {
        self.shared
            .message
            .headers
            .get(name)
            .and_then(Value::as_str)
    }
    /// The broker's delivery tag (unique per channel).
    pub fn delivery_tag(&self) -> u64 {
        self.shared.delivery_tag
    }
    /// Whether the broker flagged this as a redelivery.
    pub fn redelivered(&self) -> bool {
        self.shared.redelivered
    }
    /// The attempt number: 1 for the first, from [`ATTEMPT_HEADER`] otherwise.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
    /// Sets the attempt number (the retry layer does this between attempts).
    pub fn set_attempt(&mut self, attempt: u32) {
        self.attempt = attempt;
    }
    /// The handler's cancellation: fires when the drain's deadline has
    /// passed, or when the delivery's channel was lost (its outcome will be
    /// dropped). A handler that listens ends early and its delivery is
    /// handed back to the broker.
    ///
    /// It is a view: a handler can wait on it but not cancel it (see
    /// [`Cancellation::child_token`] for a token of your own).
    ///
    /// The token set on this copy ([`set_token`](Self::set_token), or the
    /// builder's), else the one its [`Lifeline`] carries
    /// ([`Lifeline::with_cancellation`]), else one that never fires.
    pub fn token(&self) -> &Cancellation {
        match &self.token {
            Some(token) => token,
            None => self
                .shared
                .lifeline
                .cancellation()
                .unwrap_or_else(|| Cancellation::never_ref()),
        }
    }
    /// Replaces the cancellation (the cancellation layer sets its own).
    pub fn set_token(&mut self, token: Cancellation) {
        self.token = Some(token);
    }
    /// Makes [`token`](Self::token) `view` without touching a reference
    /// count when the lifeline already carries it (the cancellation layer,
    /// as acemq's consumer loop builds it); sets a clone otherwise.
    pub(crate) fn use_token(&mut self, view: &Cancellation) {
        let carried = self
            .shared
            .lifeline
            .cancellation()
            .is_some_and(|c| c.same_as(view));
        self.token = if carried { None } else { Some(view.clone()) };
    }
    /// Whether the channel this delivery came on is gone: the broker has
    /// taken it back and will redeliver it, so nothing decided about this
    /// copy may be carried out (no publish, no in-process retry).
    pub fn is_orphaned(&self) -> bool {
        self.shared.lifeline.is_lost()
    }
    /// The delivery's [`Lifeline`].
    pub fn lifeline(&self) -> &Lifeline {
        &self.shared.lifeline
    }
    /// Replaces the lifeline (a transport sets its generation's).
    ///
    /// Every copy shares the lifeline: set it before the delivery is cloned
    /// (as a transport does, right after building it), or this copy gets a
    /// new shared part of its own (one allocation).
    pub fn set_lifeline(&mut self, lifeline: Lifeline) {
        Arc::make_mut(&mut self.shared).lifeline = lifeline;
    }
    /// Whether the innermost part of the stack has claimed this delivery:
    /// it entered the handler's side of the stack and is in flight (see
    /// [`ClaimLayer`](crate::ClaimLayer)). Before that it is *held*.
    pub fn is_claimed(&self) -> bool {
        self.shared.claim.is_claimed()
    }
    /// Whether the transport handed this delivery back while it was held
    /// ([`hand_back_if_held`](Self::hand_back_if_held) won the race).
    pub fn is_handed_back(&self) -> bool {
        self.shared.claim.is_handed_back()
    }
    /// The transport's side of the race with the claim: hands the delivery
    /// back if it is still held. `true` when it is handed back (by this
    /// call or an earlier one): the transport returns it to the broker and
    /// a later claim is refused without running the handler; `false` when
    /// it was claimed first: it is in flight, and the transport waits for
    /// its outcome as for any other.
    pub fn hand_back_if_held(&self) -> bool {
        self.shared.claim.hand_back()
    }
    /// The claim: `true` when the delivery is claimed (now or before),
    /// `false` when it was handed back first — or is being handed back now,
    /// because its lifeline says every held delivery goes back.
    pub(crate) fn claim(&self) -> bool {
        if self.shared.lifeline.hands_back_held() && self.shared.claim.hand_back() {
            return false;
        }
        self.shared.claim.claim()
    }
    /// Whether the delivery is *confirming*: claimed, its handler done,
    /// and the concurrency permit its claim took given up while only the
    /// confirm of its rung or dead-letter copy is awaited (see
    /// [`Outgoing::queued`](crate::Outgoing::queued)). It is
    /// still in flight: counted, waited for by the drain, settled only
    /// once the confirm is in.
    pub fn is_confirming(&self) -> bool {
        self.shared.permit.is_confirming()
    }
    /// The claim keeps the delivery's permit here; the returned guard
    /// gives it back when the claim ends (dropped). The permit is returned
    /// if the delivery already keeps one (a second claim point).
    pub(crate) fn keep_permit(
        &self,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<PermitGuard, tokio::sync::OwnedSemaphorePermit> {
        self.shared.permit.keep(permit)?;
        Ok(PermitGuard(self.shared.clone()))
    }
    /// Gives the permit up (kept → confirming); nothing if the delivery
    /// keeps none.
    pub(crate) fn give_up_permit(&self) -> bool {
        self.shared.permit.give_up()
    }
    /// Takes a permit again if the delivery gave its up (a rung copy
    /// refused after it was queued: the delivery is retried here, and its
    /// next attempt runs a handler). Waits for a permit like a claim does;
    /// cancel-safe (dropped, the delivery stays confirming).
    pub(crate) async fn take_permit_back(&self) {
        let Some(semaphore) = self.shared.permit.given_up() else {
            return;
        };
        // The semaphore is never closed.
        if let Ok(permit) = semaphore.acquire_owned().await {
            self.shared.permit.take_back(permit);
        }
    }
    /// User extensions.
    pub fn extensions(&self) -> &Extensions {
        &self.extensions
    }
    /// User extensions, mutable.
    pub fn extensions_mut(&mut self) -> &mut Extensions {
        &mut self.extensions
    }
}

/// A claim's guard over its delivery's permit: the permit goes back to its
/// semaphore when the claim ends (this is dropped), whether the delivery
/// still kept it or not. One reference count, no allocation.
pub(crate) struct PermitGuard(Arc<Shared>);

impl Drop for PermitGuard {
    fn drop(&mut self) {
        self.0.permit.end();
    }
}

impl std::fmt::Debug for PermitGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PermitGuard").field(&self.0.permit).finish()
    }
}
