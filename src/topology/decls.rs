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
        QueueType::Stream => vec![("x-queue-type", str_arg("stream"))],
        _ => Vec::new(),
    }
}

/// The type of what a queue dead-letters into and waits on: its own, but
/// classic for a stream (a stream takes no dead-letter or TTL arguments).
fn side_kind(kind: QueueType) -> QueueType {
    if kind == QueueType::Stream {
        QueueType::Classic
    } else {
        kind
    }
}

/// A stream's (or each partition's) arguments: its type and retention.
fn stream_args(q: &QueueConfig) -> FieldTable {
    let mut args = type_args(QueueType::Stream);
    let bytes = |n: u64| AMQPValue::LongLongInt(i64::try_from(n).unwrap_or(i64::MAX));
    if let Some(n) = q.max_length_bytes {
        args.push(("x-max-length-bytes", bytes(n)));
    }
    if let Some(age) = q.max_age {
        args.push(("x-max-age", str_arg(&format!("{}s", age.as_secs()))));
    }
    if let Some(n) = q.stream_max_segment_size_bytes {
        args.push(("x-stream-max-segment-size-bytes", bytes(n)));
    }
    let mut arguments = table(args);
    for (k, v) in &q.arguments {
        arguments.insert(ShortString::from(k.as_str()), arg_value(v));
    }
    arguments
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
        let mut topology_exchanges: Vec<ExchangeDecl> = exchanges;
        for q in &config.queues {
            decls.extend(Self::for_queue(q));
            bindings.extend(Self::bindings_of(q));
            // A passive super stream's exchange is declared elsewhere too.
            if q.is_super_stream() && !q.passive {
                topology_exchanges.push(ExchangeDecl {
                    name: q.name.clone(),
                    kind: ExchangeKind::Direct,
                    durable: true,
                });
            }
        }
        Topology {
            exchanges: topology_exchanges,
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
        if q.is_stream() {
            return Self::for_stream(q);
        }
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
        out.extend(rung_decls(q));
        out
    }

    /// A stream's declarations: the stream, or each partition of a super
    /// stream, with its retention; its dead-letter queue and rungs
    /// (classic), the rungs dead-lettering into its work queue, and the
    /// work queue.
    fn for_stream(q: &QueueConfig) -> Vec<QueueDecl> {
        let mut out: Vec<QueueDecl> = q
            .stream_partitions()
            .into_iter()
            .map(|(name, _)| QueueDecl {
                name,
                arguments: stream_args(q),
                passive: q.passive,
                delivery_limit: None,
            })
            .collect();
        if q.dead_letter {
            out.push(QueueDecl {
                name: q.dlq_name(),
                arguments: FieldTable::default(),
                passive: q.passive,
                delivery_limit: None,
            });
        }
        out.extend(rung_decls(q));
        if let Some(work) = q.work_queue_name() {
            out.push(QueueDecl {
                name: work,
                arguments: FieldTable::default(),
                passive: q.passive,
                delivery_limit: None,
            });
        }
        out
    }

    /// The bindings of one queue: one per routing key, or one with the empty
    /// key when it gives none. A super stream's partitions are bound to its
    /// exchange in order (`x-stream-partition-order`).
    pub(crate) fn bindings_of(q: &QueueConfig) -> Vec<BindingDecl> {
        let mut out = Vec::new();
        if q.is_super_stream() && !q.passive {
            for (order, (partition, key)) in q.stream_partitions().into_iter().enumerate() {
                let order = i32::try_from(order).unwrap_or(i32::MAX);
                out.push(BindingDecl {
                    queue: partition,
                    exchange: q.name.clone(),
                    routing_key: key,
                    arguments: table(vec![(
                        "x-stream-partition-order",
                        AMQPValue::LongInt(order),
                    )]),
                });
            }
        }
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

/// A queue's rungs (classic for a stream), none with a delivery limit
/// (nothing consumes them).
fn rung_decls(q: &QueueConfig) -> impl Iterator<Item = QueueDecl> + '_ {
    q.rungs().into_iter().map(|(name, delay)| QueueDecl {
        name,
        arguments: table(rung_args(q, delay)),
        passive: q.passive,
        delivery_limit: None,
    })
}

fn rung_args(q: &QueueConfig, delay: Duration) -> Vec<(&'static str, AMQPValue)> {
    let mut args = type_args(side_kind(q.kind));
    let ttl = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
    args.push(("x-message-ttl", AMQPValue::LongLongInt(ttl)));
    args.push(("x-dead-letter-exchange", str_arg("")));
    // A stream's rungs lead to its work queue: nothing is appended back to
    // the stream, which other readers share.
    let back_to = q.work_queue_name().unwrap_or_else(|| q.name.clone());
    args.push(("x-dead-letter-routing-key", str_arg(&back_to)));
    if q.kind == QueueType::Quorum {
        args.push(("x-dead-letter-strategy", str_arg("at-least-once")));
        args.push(("x-overflow", str_arg("reject-publish")));
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names<T>(items: &[T], name: impl Fn(&T) -> &str) -> Vec<String> {
        items.iter().map(|i| name(i).to_owned()).collect()
    }

    #[test]
    fn a_super_stream_declares_its_exchange_and_bindings_unless_passive() {
        let yaml = "queues:\n  - name: s\n    type: stream\n    partitions: 2\n";
        let t = Topology::from_config(&Config::from_yaml_str(yaml).unwrap());
        assert_eq!(names(t.exchanges(), |x| &x.name), ["s"]);
        assert_eq!(names(t.decls(), |d| &d.name), ["s-0", "s-1"]);
        assert_eq!(names(t.bindings(), |b| &b.routing_key), ["0", "1"]);

        let passive = Config::from_yaml_str(&format!("{yaml}    passive: true\n")).unwrap();
        let t = Topology::from_config(&passive);
        assert!(t.exchanges().is_empty(), "declared elsewhere");
        assert!(t.bindings().is_empty());
        assert!(t.decls().iter().all(|d| d.passive));
    }
}
