//! What to declare: the exchanges, queues (with their dead-letter queues
//! and rungs) and bindings a config names, as data.

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use super::delivery_limit::{self, Wanted};
use crate::config::{ArgValue, Arguments, Config, ExchangeKind, QueueConfig, QueueType};

/// One queue to declare, with its arguments.
///
/// Example: the one on [`Topology`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct QueueDecl {
    /// The queue name.
    pub name: String,
    /// Its `x-` arguments.
    pub arguments: FieldTable,
    /// Only check that it exists (`passive`), declaring nothing.
    pub passive: bool,
    /// The `x-delivery-limit` acemq put in `arguments` (a quorum queue or
    /// its dead-letter queue; not one the config's own `arguments` set).
    pub(crate) delivery_limit: Option<Wanted>,
}

/// One exchange to declare.
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ExchangeDecl {
    /// The exchange name.
    pub name: String,
    /// Its type.
    pub kind: ExchangeKind,
    /// Survives a broker restart.
    pub durable: bool,
}

/// One binding of a queue to an exchange.
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct BindingDecl {
    /// The queue.
    pub queue: String,
    /// The exchange.
    pub exchange: String,
    /// The routing key (empty for fanout and headers exchanges).
    pub routing_key: String,
    /// The binding's arguments (what a headers exchange matches).
    pub arguments: FieldTable,
}

/// Everything the config names, in declaration order: exchanges, queues,
/// bindings.
///
/// ```
/// use acemq::config::{Config, QueueConfig, RetriesConfig};
/// use acemq::topology::Topology;
/// use std::time::Duration;
///
/// let mut q = QueueConfig::new("shop.orders");
/// q.dead_letter = true;
/// q.retries = Some(RetriesConfig::new(3, Duration::from_secs(60), Duration::from_secs(120)));
/// let topology = Topology::from_config(&Config::new([q]));
/// let names: Vec<&str> = topology.decls().iter().map(|d| d.name.as_str()).collect();
/// assert_eq!(names, ["shop.orders", "shop.orders.dlq", "shop.orders.retry.60s", "shop.orders.retry.120s"]);
/// assert!(!topology.get("shop.orders").unwrap().passive);
/// ```
///
/// Declaring it needs a broker: `topology.declare(&conn).await?` (see
/// `examples/own_consumer.rs`).
#[derive(Clone, Debug, Default)]
pub struct Topology {
    exchanges: Vec<ExchangeDecl>,
    decls: Vec<QueueDecl>,
    bindings: Vec<BindingDecl>,
}

/// The AMQP value of a config argument: integers as signed 64-bit,
/// numbers with a fraction as doubles, strings as long strings.
pub(crate) fn arg_value(v: &ArgValue) -> AMQPValue {
    match v {
        ArgValue::Bool(b) => AMQPValue::Boolean(*b),
        ArgValue::Int(n) => AMQPValue::LongLongInt(*n),
        ArgValue::Float(f) => AMQPValue::Double(*f),
        ArgValue::String(s) => str_arg(s),
    }
}

fn arguments_table(args: &Arguments) -> FieldTable {
    let map: BTreeMap<ShortString, AMQPValue> = args
        .iter()
        .map(|(k, v)| (ShortString::from(k.as_str()), arg_value(v)))
        .collect();
    FieldTable::from(map)
}

fn str_arg(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.to_owned()))
}

fn table(entries: Vec<(&str, AMQPValue)>) -> FieldTable {
    let map: BTreeMap<ShortString, AMQPValue> = entries
        .into_iter()
        .map(|(k, v)| (ShortString::from(k), v))
        .collect();
    FieldTable::from(map)
}

fn type_args(kind: QueueType) -> Vec<(&'static str, AMQPValue)> {
    match kind {
        QueueType::Quorum => vec![("x-queue-type", str_arg("quorum"))],
        _ => Vec::new(),
    }
}

impl Topology {
    /// The declarations for `config`.
    pub fn from_config(config: &Config) -> Self {
        let exchanges = config
            .exchanges
            .iter()
            .map(|x| ExchangeDecl {
                name: x.name.clone(),
                kind: x.kind,
                durable: x.durable,
            })
            .collect();
        let mut decls = Vec::new();
        let mut bindings = Vec::new();
        for q in &config.queues {
            decls.extend(Self::for_queue(q));
            bindings.extend(Self::bindings_of(q));
        }
        Topology {
            exchanges,
            decls,
            bindings,
        }
    }

    /// The declarations for one queue. A quorum queue carries
    /// `x-delivery-limit` = `max_redeliveries` + 10 (so acemq's bound, with
    /// its reason `redelivered`, fires before the broker's) and its quorum
    /// dead-letter queue 10,000, unless the config's `arguments` set one;
    /// rungs carry none (nothing consumes them).
    #[doc(hidden)]
    pub fn for_queue(q: &QueueConfig) -> Vec<QueueDecl> {
        let mut out = Vec::new();
        let quorum = q.kind == QueueType::Quorum;
        let mut main = type_args(q.kind);
        if q.dead_letter {
            main.push(("x-dead-letter-exchange", str_arg("")));
            main.push(("x-dead-letter-routing-key", str_arg(&q.dlq_name())));
        }
        if let Some((min, max)) = q.delayed_retry() {
            // Retries wait in the queue: failed returns only, so hand-backs
            // (`basic.nack`) come back at once.
            let ms = |d: Duration| {
                AMQPValue::LongLongInt(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            };
            main.push(("x-delayed-retry-type", str_arg("failed")));
            main.push(("x-delayed-retry-min", ms(min)));
            main.push(("x-delayed-retry-max", ms(max)));
        }
        let mut arguments = table(main);
        let own_limit = q.arguments.contains_key(delivery_limit::ARGUMENT);
        let mut main_limit = None;
        if quorum && !own_limit {
            let wanted = Wanted::main(q.max_redeliveries);
            let (k, v) = wanted.argument();
            arguments.insert(k, v);
            main_limit = Some(wanted);
        }
        for (k, v) in &q.arguments {
            arguments.insert(ShortString::from(k.as_str()), arg_value(v));
        }
        out.push(QueueDecl {
            name: q.name.clone(),
            arguments,
            passive: q.passive,
            delivery_limit: main_limit,
        });
        if q.dead_letter {
            let mut arguments = table(type_args(q.kind));
            let dlq_limit = quorum.then(Wanted::dlq);
            if let Some(wanted) = dlq_limit {
                let (k, v) = wanted.argument();
                arguments.insert(k, v);
            }
            out.push(QueueDecl {
                name: q.dlq_name(),
                arguments,
                passive: q.passive,
                delivery_limit: dlq_limit,
            });
        }
        for (name, delay) in q.rungs() {
            out.push(QueueDecl {
                name,
                arguments: table(rung_args(q, delay)),
                passive: q.passive,
                delivery_limit: None,
            });
        }
        out
    }

    /// The bindings of one queue: one per routing key, or one with the empty
    /// key when it gives none.
    pub(crate) fn bindings_of(q: &QueueConfig) -> Vec<BindingDecl> {
        let mut out = Vec::new();
        for b in &q.bindings {
            let arguments = arguments_table(&b.arguments);
            let keys: Vec<&str> = if b.routing_keys.is_empty() {
                vec![""]
            } else {
                b.routing_keys.iter().map(String::as_str).collect()
            };
            for key in keys {
                out.push(BindingDecl {
                    queue: q.name.clone(),
                    exchange: b.exchange.clone(),
                    routing_key: key.to_owned(),
                    arguments: arguments.clone(),
                });
            }
        }
        out
    }

    /// All queue declarations.
    pub fn decls(&self) -> &[QueueDecl] {
        &self.decls
    }

    /// All exchange declarations.
    #[doc(hidden)]
    pub fn exchanges(&self) -> &[ExchangeDecl] {
        &self.exchanges
    }

    /// All bindings.
    #[doc(hidden)]
    pub fn bindings(&self) -> &[BindingDecl] {
        &self.bindings
    }

    /// The declaration of `queue`, if the topology has one.
    pub fn get(&self, queue: &str) -> Option<&QueueDecl> {
        self.decls.iter().find(|d| d.name == queue)
    }
}

fn rung_args(q: &QueueConfig, delay: Duration) -> Vec<(&'static str, AMQPValue)> {
    let mut args = type_args(q.kind);
    let ttl = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
    args.push(("x-message-ttl", AMQPValue::LongLongInt(ttl)));
    args.push(("x-dead-letter-exchange", str_arg("")));
    args.push(("x-dead-letter-routing-key", str_arg(&q.name)));
    if q.kind == QueueType::Quorum {
        args.push(("x-dead-letter-strategy", str_arg("at-least-once")));
        args.push(("x-overflow", str_arg("reject-publish")));
    }
    args
}
