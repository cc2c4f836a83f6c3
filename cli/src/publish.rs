//! `acemq publish`: one message, to a queue or to an exchange, `mandatory`
//! and confirmed, so a message that reaches no queue or that the broker
//! refuses is an error with its own exit code, never a silent success.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use acemq::connection::close_connection;
use acemq::convert::try_properties_to_lapin;
use acemq::lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use acemq::lapin::{Confirmation, Connection};
use acemq::{Headers, Properties};
use serde::Serialize;

use crate::cli::PublishArgs;
use crate::connect::{load_config, Target};
use crate::exit::{Exit, Failure};
use crate::probe::{reply, NOT_FOUND};

/// What the publish did, for the output.
#[derive(Debug, Serialize)]
struct Report<'a> {
    broker: &'a str,
    /// `""`: the default exchange (publishing to a queue by name).
    exchange: &'a str,
    routing_key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    message_id: Option<&'a str>,
    body_bytes: usize,
    confirmed: bool,
}

/// The body: the argument, a file, or stdin (`-` for either).
fn body(args: &PublishArgs) -> Result<Vec<u8>, Failure> {
    let from_stdin = |what: &str| {
        let mut buf = Vec::new();
        std::io::stdin().lock().read_to_end(&mut buf).map_err(|e| {
            Failure::usage(format!("could not read the body from stdin ({what}): {e}"))
        })?;
        Ok(buf)
    };
    match (&args.body, &args.file) {
        (Some(b), _) if b == "-" => from_stdin("BODY is -"),
        (Some(b), _) => Ok(b.clone().into_bytes()),
        (None, Some(f)) if f == Path::new("-") => from_stdin("--file -"),
        (None, Some(f)) => std::fs::read(f).map_err(|e| {
            Failure::usage(format!(
                "could not read the body from {}: {e}; name a readable file, or `-` for stdin",
                f.display()
            ))
        }),
        (None, None) => Err(Failure::usage(
            "no body: give it as an argument, with --file FILE, or `-` to read stdin",
        )),
    }
}

/// The message's properties and headers from the flags.
fn properties(args: &PublishArgs) -> Result<acemq::lapin::BasicProperties, Failure> {
    let mut p = Properties::default();
    p.content_type.clone_from(&args.content_type);
    p.content_encoding.clone_from(&args.content_encoding);
    p.message_id.clone_from(&args.message_id);
    p.correlation_id.clone_from(&args.correlation_id);
    p.reply_to.clone_from(&args.reply_to);
    p.kind.clone_from(&args.kind);
    p.app_id.clone_from(&args.app_id);
    p.priority = args.priority;
    p.timestamp = args.timestamp;
    p.delivery_mode = Some(if args.persistent { 2 } else { 1 });
    let mut headers = Headers::new();
    for (name, value) in &args.headers {
        headers.insert(name.clone(), value.clone());
    }
    let props = try_properties_to_lapin(&p, &headers).map_err(|e| Failure::usage(e.to_string()))?;
    // Not among the properties the library's conversion carries (a copy it
    // republishes must not restart its TTL): set here, as its publisher does.
    Ok(match args.expiration {
        Some(ms) => props.with_expiration(ms.to_string().into()),
        None => props,
    })
}

/// `acemq publish`.
pub(crate) async fn publish(
    args: &PublishArgs,
    amqp_addr: Option<&str>,
    json: bool,
) -> Result<Exit, Failure> {
    let config = args.config.as_deref().map(load_config).transpose()?;
    let target = Target::new(amqp_addr, config.as_ref())?;
    let (exchange, routing_key) = match (&args.queue, &args.exchange) {
        (Some(q), _) => (String::new(), q.clone()),
        (None, Some(x)) => (x.clone(), args.routing_key.clone().unwrap_or_default()),
        // clap requires one of the two.
        (None, None) => {
            return Err(Failure::usage(
                "give --queue Q or --exchange X --routing-key K",
            ))
        }
    };
    for (what, name) in [("exchange", &exchange), ("routing key", &routing_key)] {
        if name.len() > 255 {
            return Err(Failure::usage(format!(
                "the {what} is {} bytes long, above AMQP's limit of 255",
                name.len()
            )));
        }
    }
    let body = body(args)?;
    let props = properties(args)?;
    let wait = Duration::from_secs(args.confirm_timeout);
    let (conn, broker) = target.connect("publish").await?;
    let result = send(&conn, &exchange, &routing_key, &body, props, wait).await;
    let _ = close_connection(&conn, "OK").await;
    result?;
    let report = Report {
        broker: &broker,
        exchange: &exchange,
        routing_key: &routing_key,
        message_id: args.message_id.as_deref(),
        body_bytes: body.len(),
        confirmed: true,
    };
    if json {
        crate::output::json(&report);
    } else {
        let to = if exchange.is_empty() {
            format!("queue {routing_key}")
        } else {
            format!("exchange {exchange} with routing key {routing_key:?}")
        };
        println!(
            "published {} byte{} to {to} on {broker}: confirmed",
            body.len(),
            if body.len() == 1 { "" } else { "s" }
        );
    }
    Ok(Exit::Ok)
}

/// Publishes on a confirm channel of its own and waits (up to `wait`) for
/// the confirm.
async fn send(
    conn: &Connection,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    props: acemq::lapin::BasicProperties,
    wait: Duration,
) -> Result<(), Failure> {
    let to = if exchange.is_empty() {
        format!("queue {routing_key:?}")
    } else {
        format!("exchange {exchange:?}")
    };
    let failed = |e: acemq::lapin::Error| match reply(&e) {
        Some((NOT_FOUND, text)) => Failure::data(format!(
            "there is no {to} to publish to (the broker said {text:?}); declare it (acemq \
             topology apply) or name another. Nothing was published"
        )),
        _ => Failure::unavailable(format!("could not publish to {to}: {e}")),
    };
    let ch = conn.create_channel().await.map_err(failed)?;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(failed)?;
    let publish = async {
        let confirm = ch
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                props,
            )
            .await?;
        confirm.await
    };
    let confirmation = match tokio::time::timeout(wait, publish).await {
        Ok(c) => c.map_err(failed)?,
        Err(_) => {
            return Err(Failure::unavailable(format!(
                "the broker did not confirm the message to {to} within {}s (blocked by a \
                 memory or disk alarm?); it may or may not have been taken",
                wait.as_secs()
            )))
        }
    };
    match confirmation {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_)) => {
            Err(Failure::data(if exchange.is_empty() {
                format!(
                    "no queue named {routing_key:?}: the broker returned the message \
                     (NO_ROUTE), nothing was delivered; declare the queue or check its name"
                )
            } else {
                format!(
                    "exchange {exchange:?} routed {routing_key:?} to no queue: the broker \
                     returned the message (NO_ROUTE), nothing was delivered; bind a queue or \
                     check the routing key"
                )
            }))
        }
        Confirmation::Nack(None) => Err(Failure::new(
            Exit::Nacked,
            format!(
                "the broker refused the message to {to} (basic.nack): a queue at its length \
                 limit with `overflow: reject-publish`, or a broker fault; nothing was \
                 delivered, try again later"
            ),
        )),
    }
}
