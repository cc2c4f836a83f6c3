//! The comparison itself: one item per exchange, queue and binding of the
//! config, each probed on the broker (see [`crate::probe`]), nothing
//! changed.

use acemq::config::Config;
use acemq::layers::escape;
use acemq::topology::{BindingDecl, Topology};
use serde::Serialize;

use crate::exit::Failure;
use crate::probe::{Equivalence, Found, Prober};

/// What one item of the topology is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Role {
    Queue,
    DeadLetterQueue,
    RetryRung,
    /// A stream, or one partition of a super stream.
    Stream,
    /// A stream's work queue (`{stream}.work`), where its rungs lead.
    WorkQueue,
    Exchange,
    Binding,
}

impl Role {
    pub(crate) fn noun(self) -> &'static str {
        match self {
            Role::Queue | Role::DeadLetterQueue | Role::RetryRung | Role::WorkQueue => "queue",
            Role::Stream => "stream",
            Role::Exchange => "exchange",
            Role::Binding => "binding",
        }
    }

    /// Whether the item is a queue of any kind (a stream included).
    pub(crate) fn is_queue(self) -> bool {
        !matches!(self, Role::Exchange | Role::Binding)
    }
}

/// How the broker's item compares with the config's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum State {
    /// Declared as the config says (as far as the broker checks).
    Same,
    /// Not there.
    Missing,
    /// There, with another argument, type or durability.
    Differs,
    /// There, but could not be checked (the broker refused the probe).
    Unchecked,
    /// A binding: AMQP cannot read bindings; `apply` applies them.
    NotRead,
}

/// One exchange, queue or binding of the plan.
#[derive(Debug, Serialize)]
pub(crate) struct Item {
    pub(crate) role: Role,
    pub(crate) name: String,
    pub(crate) state: State,
    /// The argument that differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) argument: Option<String>,
    /// What the broker said, when it refused a probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) broker_said: Option<String>,
    /// The config marks the queue passive (declared elsewhere), or the
    /// exchange is one the config binds to without declaring it (`amq.*`):
    /// only its existence is checked, and `apply` never creates it.
    pub(crate) managed_elsewhere: bool,
}

impl Item {
    pub(crate) fn new(role: Role, name: impl Into<String>, state: State) -> Self {
        Item {
            role,
            name: name.into(),
            state,
            argument: None,
            broker_said: None,
            managed_elsewhere: false,
        }
    }

    /// True when this item makes the plan differ from the config.
    pub(crate) fn is_difference(&self) -> bool {
        !matches!(self.state, State::Same | State::NotRead)
    }

    /// `+ queue q (missing)`, `~ queue q: x-message-ttl differs (...)`,
    /// `= queue q`.
    pub(crate) fn line(&self) -> String {
        let noun = self.role.noun();
        // Names come from the config and replies from the broker; both are
        // shown escaped all the same.
        let name = escape(&self.name);
        let said = escape(self.broker_said.as_deref().unwrap_or_default());
        match self.state {
            State::Same if self.managed_elsewhere => {
                format!(
                    "= {noun} {name} (exists; managed elsewhere, only its existence is checked)"
                )
            }
            State::Same => format!("= {noun} {name}"),
            State::Missing if self.managed_elsewhere => {
                format!("+ {noun} {name} (missing; managed elsewhere: apply will not create it)")
            }
            State::Missing if self.role == Role::Binding => {
                format!("+ {noun} {name} (missing: its queue or exchange is missing)")
            }
            State::Missing => format!("+ {noun} {name} (missing)"),
            State::Differs => format!(
                "~ {noun} {name}: {} differs ({said})",
                self.argument.as_deref().unwrap_or("a setting")
            ),
            State::Unchecked => format!("! {noun} {name}: exists, could not be checked ({said})"),
            State::NotRead => {
                format!("? {noun} {name}: applied by `apply` (AMQP cannot read bindings)")
            }
        }
    }
}

/// The whole comparison.
#[derive(Debug, Serialize)]
pub(crate) struct Plan {
    pub(crate) broker: String,
    pub(crate) items: Vec<Item>,
}

/// Counts for the summary line.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Counts {
    pub(crate) missing: usize,
    pub(crate) differs: usize,
    pub(crate) unchecked: usize,
    pub(crate) same: usize,
    /// Bindings whose queue or exchange is missing (so they are too).
    pub(crate) bindings_missing: usize,
    /// Bindings between a queue and an exchange that both exist: whether
    /// they are bound cannot be read.
    pub(crate) bindings_not_read: usize,
}

impl Plan {
    pub(crate) fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for item in &self.items {
            match item.state {
                State::Missing if item.role == Role::Binding => c.bindings_missing += 1,
                State::Missing => c.missing += 1,
                State::Differs => c.differs += 1,
                State::Unchecked => c.unchecked += 1,
                State::Same => c.same += 1,
                State::NotRead => c.bindings_not_read += 1,
            }
        }
        c
    }

    pub(crate) fn has_differences(&self) -> bool {
        self.items.iter().any(Item::is_difference)
    }
}

fn binding_name(b: &BindingDecl) -> String {
    let mut name = format!("{} to exchange {}", b.queue, b.exchange);
    if !b.routing_key.is_empty() {
        name.push_str(&format!(" key {:?}", b.routing_key));
    }
    if !b.arguments.inner().is_empty() {
        let keys: Vec<&str> = b.arguments.inner().keys().map(|k| k.as_str()).collect();
        name.push_str(&format!(" matching {}", keys.join(", ")));
    }
    name
}

/// The role of each queue declaration, from the config that produced it.
fn role_of(config: &Config, queue: &str) -> Role {
    for q in &config.queues {
        if q.is_stream() && q.stream_partitions().iter().any(|(name, _)| name == queue) {
            return Role::Stream;
        }
        if q.work_queue_name().as_deref() == Some(queue) {
            return Role::WorkQueue;
        }
        if q.name == queue {
            return Role::Queue;
        }
        if q.dead_letter && q.dlq_name() == queue {
            return Role::DeadLetterQueue;
        }
        if q.rungs().iter().any(|(name, _)| name == queue) {
            return Role::RetryRung;
        }
    }
    Role::Queue
}

/// Probes every declaration of `topology`, changing nothing.
pub(crate) async fn probe_all(
    prober: &mut Prober<'_>,
    config: &Config,
    topology: &Topology,
    broker: String,
) -> Result<Plan, Failure> {
    let mut items = Vec::new();
    for x in topology.exchanges() {
        let mut item = Item::new(Role::Exchange, &x.name, State::Same);
        match prober.exchange(&x.name).await? {
            Found::Present(existing) => {
                settle(&mut item, prober.exchange_equivalent(&existing, x).await?)
            }
            Found::Missing { message } => missing(&mut item, message),
            Found::Locked { message } => unchecked(&mut item, message),
        }
        items.push(item);
    }
    // Exchanges bound to but not declared by the config (amq.*): checked
    // for existence only.
    let mut others: Vec<&str> = Vec::new();
    for b in topology.bindings() {
        let declared = topology.exchanges().iter().any(|x| x.name == b.exchange);
        if !declared && !others.contains(&b.exchange.as_str()) {
            others.push(&b.exchange);
        }
    }
    for name in others {
        let mut item = Item::new(Role::Exchange, name, State::Same);
        item.managed_elsewhere = true;
        if let Found::Missing { message } = prober.exchange(name).await? {
            missing(&mut item, message);
        }
        items.push(item);
    }
    for d in topology.decls() {
        let mut item = Item::new(role_of(config, &d.name), &d.name, State::Same);
        item.managed_elsewhere = d.passive;
        match prober.queue(&d.name).await? {
            // Never declared non-passively: acemq does not own its arguments.
            Found::Present(_) if d.passive => {}
            Found::Present(existing) => {
                settle(&mut item, prober.queue_equivalent(&existing, d).await?)
            }
            Found::Missing { message } => missing(&mut item, message),
            Found::Locked { message } => unchecked(&mut item, message),
        }
        items.push(item);
    }
    for b in topology.bindings() {
        let missing = |queue: bool, name: &str| {
            items
                .iter()
                .any(|i| i.role.is_queue() == queue && i.name == name && i.state == State::Missing)
        };
        let state = if missing(true, &b.queue) || missing(false, &b.exchange) {
            State::Missing
        } else {
            State::NotRead
        };
        items.push(Item::new(Role::Binding, binding_name(b), state));
    }
    Ok(Plan { broker, items })
}

fn settle(item: &mut Item, eq: Equivalence) {
    match eq {
        Equivalence::Same => item.state = State::Same,
        Equivalence::Differs { argument, message } => {
            item.state = State::Differs;
            item.argument = Some(argument);
            item.broker_said = Some(message);
        }
        Equivalence::Unchecked { message } => unchecked(item, message),
    }
}

fn missing(item: &mut Item, message: String) {
    item.state = State::Missing;
    item.broker_said = Some(message);
}

fn unchecked(item: &mut Item, message: String) {
    item.state = State::Unchecked;
    item.broker_said = Some(message);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(role: Role, state: State) -> Item {
        Item::new(role, "shop.orders", state)
    }

    #[test]
    fn each_item_reads_as_one_line_with_its_sign() {
        assert_eq!(item(Role::Queue, State::Same).line(), "= queue shop.orders");
        assert_eq!(
            item(Role::RetryRung, State::Missing).line(),
            "+ queue shop.orders (missing)"
        );
        let mut differs = item(Role::Queue, State::Differs);
        differs.argument = Some("x-message-ttl".into());
        differs.broker_said = Some("PRECONDITION_FAILED - …".into());
        assert_eq!(
            differs.line(),
            "~ queue shop.orders: x-message-ttl differs (PRECONDITION_FAILED - …)"
        );
        let mut passive = item(Role::Queue, State::Missing);
        passive.managed_elsewhere = true;
        assert!(passive.line().contains("apply will not create it"));
        assert!(item(Role::Binding, State::NotRead)
            .line()
            .starts_with("? binding shop.orders: applied by `apply`"));
    }

    #[test]
    fn only_what_the_broker_holds_otherwise_is_a_difference() {
        let plan = Plan {
            broker: String::new(),
            items: vec![
                item(Role::Queue, State::Same),
                item(Role::Binding, State::NotRead),
            ],
        };
        assert!(
            !plan.has_differences(),
            "a binding that cannot be read is not one"
        );
        for state in [State::Missing, State::Differs, State::Unchecked] {
            assert!(item(Role::Queue, state).is_difference(), "{state:?}");
        }
    }

    #[test]
    fn a_queue_declaration_is_named_by_its_role() {
        let config = Config::from_yaml_str(
            "queues:\n  - name: q\n    dead_letter: true\n    retries: { max_attempts: 3, \
             initial_delay: 1, max_delay: 2, broker_wait_threshold: 1 }\n",
        )
        .unwrap();
        assert_eq!(role_of(&config, "q"), Role::Queue);
        assert_eq!(role_of(&config, "q.dlq"), Role::DeadLetterQueue);
        assert_eq!(role_of(&config, "q.retry.2s"), Role::RetryRung);
        let streams = Config::from_yaml_str(
            "queues:\n  - name: s\n    type: stream\n    dead_letter: true\n    retries: { \
             max_attempts: 3, initial_delay: 1, max_delay: 2, broker_wait_threshold: 1 }\n  \
             - name: sup\n    type: stream\n    partitions: 2\n",
        )
        .unwrap();
        assert_eq!(role_of(&streams, "s"), Role::Stream);
        assert_eq!(role_of(&streams, "sup-1"), Role::Stream);
        assert_eq!(role_of(&streams, "s.work"), Role::WorkQueue);
        assert_eq!(role_of(&streams, "s.dlq"), Role::DeadLetterQueue);
        assert_eq!(role_of(&streams, "s.retry.1s"), Role::RetryRung);
        assert_eq!(Role::Stream.noun(), "stream");
        assert!(Role::WorkQueue.is_queue() && !Role::Binding.is_queue());
    }
}
