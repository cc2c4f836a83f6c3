//! `acemq dlq peek`: the first messages of a dead-letter queue, each
//! given back.
//!
//! Messages are taken with `basic.get` and manual acknowledgement on one
//! channel of their own, never acknowledged, and given back together by
//! closing that channel: the broker requeues what a closed channel held.
//! Killed half-way, the same happens when the connection drops.
//!
//! Closing rather than `basic.nack(requeue, multiple)` is deliberate. Both
//! put a classic queue's messages back at its head in their order (3.10.8
//! and 4.0.5), and a quorum queue's on 4.0.5; but on 3.10.8 a nack or
//! reject with requeue puts a quorum queue's messages at its *back*, while
//! a closed channel's go back to the head in order (measured here; see
//! docs/cli.md, with what a peek changes: the redelivered flag and, on
//! quorum queues, `x-delivery-count`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use acemq::connection::{close_channel, close_connection};
use acemq::convert::headers_from_table;
use acemq::lapin::message::BasicGetMessage;
use acemq::lapin::options::{BasicGetOptions, QueueDeclareOptions};
use acemq::lapin::types::FieldTable;
use acemq::layers::dead_letter::{
    ATTEMPTS_HEADER, DEAD_LETTERED_AT_HEADER, ERROR_HEADER, QUEUE_HEADER, REASON_HEADER,
};
use acemq::layers::headers::{
    DELIVERY_COUNT_HEADER, ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER,
};
use acemq::{Headers, Value};
use serde::Serialize;

use crate::cli::{queue_pair, PeekArgs};
use crate::connect::{load_config, Target};
use crate::exit::{Exit, Failure};
use crate::output::{age, cut, escape_bytes};
use crate::probe::{reply, NOT_FOUND};

/// The longest error text shown in the text output, in characters (the
/// JSON output has all of it).
const ERROR_SHOWN: usize = 200;

/// Where a message was first published, and which headers said so.
#[derive(Debug, Default, Serialize)]
struct Origin {
    exchange: Option<String>,
    routing_key: Option<String>,
    /// `acemq` (`x-acemq-original-*`), `x-death` (the broker's own
    /// dead-lettering), or absent when neither was there.
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<&'static str>,
}

/// One message as the peek shows it.
#[derive(Debug, Serialize)]
struct Peeked {
    /// Its place in the queue when the peek took it, from 1.
    position: usize,
    message_id: Option<String>,
    /// The position of an earlier message with the same message id, when
    /// this one is a repeat (a crash between the copy and the
    /// acknowledgement can dead-letter a message twice).
    repeat_of: Option<usize>,
    /// `x-acemq-reason`; absent when the broker dead-lettered it itself.
    reason: Option<String>,
    /// Why the broker dead-lettered it (`x-death`), when acemq did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    broker_reason: Option<String>,
    attempts: Option<i64>,
    /// `x-acemq-queue`: the queue it was dead-lettered from.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<String>,
    origin: Origin,
    dead_lettered_at_ms: Option<i64>,
    /// Seconds since `x-acemq-dead-lettered-at`, else since the message's
    /// timestamp property.
    age_seconds: Option<u64>,
    error: Option<String>,
    redelivered: bool,
    /// The broker's `x-delivery-count` (quorum queues).
    #[serde(skip_serializing_if = "Option::is_none")]
    delivery_count: Option<i64>,
    body_bytes: usize,
    /// The first bytes of the body, escaped.
    body: String,
}

fn text(h: &Headers, name: &str) -> Option<String> {
    h.get(name).and_then(Value::as_str).map(str::to_owned)
}

/// The most recent `x-death` entry's exchange, first routing key and reason.
fn x_death(h: &Headers) -> Option<(Option<String>, Option<String>, Option<String>)> {
    let Some(Value::Array(entries)) = h.get("x-death") else {
        return None;
    };
    let Some(Value::Table(first)) = entries.first() else {
        return None;
    };
    let key = match first.get("routing-keys") {
        Some(Value::Array(keys)) => keys.first().and_then(Value::as_str).map(str::to_owned),
        _ => None,
    };
    Some((text(first, "exchange"), key, text(first, "reason")))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn summarise(position: usize, m: &BasicGetMessage, body_bytes: usize) -> Peeked {
    let d = &m.delivery;
    let h = d
        .properties
        .headers()
        .as_ref()
        .map(headers_from_table)
        .unwrap_or_default();
    let death = x_death(&h);
    let mut origin = Origin {
        exchange: text(&h, ORIGINAL_EXCHANGE_HEADER),
        routing_key: text(&h, ORIGINAL_ROUTING_KEY_HEADER),
        from: None,
    };
    if origin.exchange.is_some() || origin.routing_key.is_some() {
        origin.from = Some("acemq");
    } else if let Some((exchange, key, _)) = &death {
        origin = Origin {
            exchange: exchange.clone(),
            routing_key: key.clone(),
            from: Some("x-death"),
        };
    }
    let reason = text(&h, REASON_HEADER);
    let dead_lettered_at_ms = h.get(DEAD_LETTERED_AT_HEADER).and_then(Value::as_i64);
    let since_ms = dead_lettered_at_ms.or_else(|| {
        d.properties
            .timestamp()
            .and_then(|s| i64::try_from(s).ok())
            .map(|s| s.saturating_mul(1000))
    });
    Peeked {
        position,
        message_id: d.properties.message_id().as_ref().map(|s| s.to_string()),
        repeat_of: None,
        broker_reason: if reason.is_none() {
            death.and_then(|(_, _, r)| r)
        } else {
            None
        },
        reason,
        attempts: h.get(ATTEMPTS_HEADER).and_then(Value::as_i64),
        queue: text(&h, QUEUE_HEADER),
        origin,
        dead_lettered_at_ms,
        age_seconds: since_ms.map(|t| u64::try_from((now_ms() - t).max(0) / 1000).unwrap_or(0)),
        error: text(&h, ERROR_HEADER),
        redelivered: d.redelivered,
        delivery_count: h.get(DELIVERY_COUNT_HEADER).and_then(Value::as_i64),
        body_bytes: d.data.len(),
        body: escape_bytes(&d.data, body_bytes),
    }
}

fn matches(p: &Peeked, wanted: Option<&str>) -> bool {
    match wanted {
        None => true,
        Some("none") => p.reason.is_none(),
        Some(r) => p.reason.as_deref() == Some(r),
    }
}

/// What the peek did, for the summary.
#[derive(Debug, Serialize)]
struct PeekReport {
    broker: String,
    queue: String,
    /// Messages ready in the queue when the peek started.
    held: u32,
    /// Messages taken (and given back).
    taken: usize,
    /// The highest `x-delivery-count` among the messages taken, as they
    /// were delivered to this peek (quorum queues count deliveries: the
    /// peek raised each by one).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_delivery_count: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// Messages shown whose message id an earlier message taken had.
    repeats: usize,
    messages: Vec<Peeked>,
}

/// `acemq dlq peek`.
pub(crate) async fn peek(
    args: &PeekArgs,
    amqp_addr: Option<&str>,
    json: bool,
) -> Result<Exit, Failure> {
    let config = args.config.as_deref().map(load_config).transpose()?;
    let target = Target::new(amqp_addr, config.as_ref())?;
    let (dlq, _) = queue_pair(&args.queue);
    let (conn, broker) = target.connect("dlq peek").await?;
    let mut report = PeekReport {
        broker,
        queue: dlq,
        held: 0,
        taken: 0,
        max_delivery_count: None,
        reason: args.reason.clone(),
        repeats: 0,
        messages: Vec::new(),
    };
    let result = take_and_give_back(&conn, args, &mut report).await;
    let _ = close_connection(&conn, "OK").await;
    result?;
    if json {
        crate::output::json(&report);
    } else {
        print_text(&report);
    }
    Ok(Exit::Ok)
}

/// Takes up to `args.limit` matching messages into `report`, then gives
/// every message taken back.
async fn take_and_give_back(
    conn: &acemq::lapin::Connection,
    args: &PeekArgs,
    report: &mut PeekReport,
) -> Result<(), Failure> {
    let dlq = report.queue.as_str();
    let ch = conn
        .create_channel()
        .await
        .map_err(|e| Failure::unavailable(format!("could not open a channel: {e}")))?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    report.held = match ch
        .queue_declare(dlq.into(), passive, FieldTable::default())
        .await
    {
        Ok(q) => q.message_count(),
        Err(e) if reply(&e).is_some_and(|(code, _)| code == NOT_FOUND) => {
            return Err(Failure::data(format!(
                "there is no queue {dlq:?} to peek at ({e}); name the work queue (its dead \
                 letters are in QUEUE.dlq) or the dead-letter queue itself"
            )))
        }
        Err(e) => {
            return Err(Failure::unavailable(format!(
                "could not check queue {dlq:?}: {e}"
            )))
        }
    };
    let mut failed = None;
    // Each message id's first position among the messages taken.
    let mut first_seen = std::collections::HashMap::new();
    // Without a filter every message taken is shown, so the limit bounds
    // the loop. With one, at most what the queue held at the start is
    // taken, so a queue that is being filled is not read forever.
    let filtered = args.reason.is_some();
    while report.messages.len() < args.limit
        && (!filtered || (report.taken as u64) < u64::from(report.held))
    {
        match ch
            .basic_get(dlq.into(), BasicGetOptions { no_ack: false })
            .await
        {
            Ok(Some(m)) => {
                report.taken += 1;
                let mut p = summarise(report.taken, &m, args.body_bytes);
                if let Some(id) = &p.message_id {
                    p.repeat_of = first_seen.get(id).copied();
                    first_seen.entry(id.clone()).or_insert(p.position);
                }
                report.max_delivery_count = report.max_delivery_count.max(p.delivery_count);
                if matches(&p, args.reason.as_deref()) {
                    report.repeats += usize::from(p.repeat_of.is_some());
                    report.messages.push(p);
                }
            }
            Ok(None) => break,
            Err(e) => {
                failed = Some(Failure::unavailable(format!(
                    "could not read {dlq:?} after {} messages ({e}); what was taken goes back \
                     to the queue as the channel closes",
                    report.taken
                )));
                break;
            }
        }
    }
    // Every message taken goes back as the channel closes (never settled:
    // see the module docs for why not a nack). Were the close to fail, the
    // connection's close right after gives them back the same way.
    if ch.status().connected() {
        if let Err(e) = close_channel(&ch, "OK").await {
            failed.get_or_insert_with(|| {
                Failure::unavailable(format!(
                    "could not close the channel that holds the {} messages taken ({e}); \
                     the broker gives them back as the connection closes",
                    report.taken
                ))
            });
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn print_text(r: &PeekReport) {
    for p in &r.messages {
        let mut head = Vec::new();
        match &p.message_id {
            Some(id) => head.push(format!("message id {}", cut(id, 80))),
            None => head.push("no message id".to_owned()),
        }
        if let Some(first) = p.repeat_of {
            head.push(format!("repeat of #{first}"));
        }
        if let Some(s) = p.age_seconds {
            let what = if p.dead_lettered_at_ms.is_some() {
                "dead-lettered"
            } else {
                "published"
            };
            head.push(format!("{what} {} ago", age(Duration::from_secs(s))));
        }
        if let Some(n) = p.delivery_count {
            head.push(format!("delivery count {n}"));
        }
        if p.redelivered {
            head.push("redelivered".to_owned());
        }
        println!("#{} {}", p.position, head.join(", "));
        // Both are headers a publisher can forge (a short expiration gets
        // a message dead-lettered with them intact): escaped.
        let reason = match (&p.reason, &p.broker_reason) {
            (Some(r), _) => cut(r, ERROR_SHOWN),
            (None, Some(b)) => format!(
                "none (the broker dead-lettered it: {})",
                cut(b, ERROR_SHOWN)
            ),
            (None, None) => "none".to_owned(),
        };
        match p.attempts {
            Some(n) => println!("    reason    {reason}, after {n} attempt{}", plural(n)),
            None => println!("    reason    {reason}"),
        }
        let origin = match (&p.origin.exchange, &p.origin.routing_key) {
            (None, None) => "unknown".to_owned(),
            (x, k) => format!(
                "exchange {:?}, routing key {:?}",
                x.as_deref().unwrap_or(""),
                k.as_deref().unwrap_or("")
            ),
        };
        println!("    from      {origin}");
        if let Some(e) = &p.error {
            println!("    error     {}", cut(e, ERROR_SHOWN));
        }
        println!("    body      {} ({} bytes)", p.body, p.body_bytes);
    }
    let filter = r
        .reason
        .as_deref()
        .map(|w| format!(" with reason {w}"))
        .unwrap_or_default();
    if r.taken == 0 {
        println!("{} holds no message ready, on {}", r.queue, r.broker);
    } else {
        println!(
            "{} message{}{filter} shown of {} in {} on {}; the {} taken were given back",
            r.messages.len(),
            plural(r.messages.len() as i64),
            r.held,
            r.queue,
            r.broker,
            r.taken
        );
    }
    if r.repeats > 0 {
        println!(
            "{} of them repeat{} the message id of an earlier one; `acemq dlq replay \
             --skip-repeated` moves one copy of each",
            r.repeats,
            if r.repeats == 1 { "s" } else { "" }
        );
    }
    if let Some(n) = r.max_delivery_count {
        eprintln!(
            "note: {} counts deliveries (a quorum queue): this peek delivered each message it \
             took once more (the most delivered had x-delivery-count {n} as it came). Past the \
             queue's delivery limit (x-delivery-limit; 20 by default on RabbitMQ 4) the broker \
             drops or dead-letters a message: do not peek at it in a loop.",
            r.queue
        );
    }
}

fn plural(n: i64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
