//! `acemq topology plan` and `acemq topology apply`.
//!
//! Both start from [`Topology::from_config`], the declarations the service
//! itself makes, so the command and the library never disagree about what a
//! config means. `plan` probes each one (see [`crate::probe`]) and changes
//! nothing; `apply` plans first, refuses when anything conflicts (nothing is
//! declared then), and otherwise declares through [`Topology::declare`].

use std::path::Path;

use acemq::config::Config;
use acemq::topology::{BindingDecl, Topology, TopologyError};
use serde::Serialize;

use crate::connect::{load_config, Target};
use crate::exit::{Exit, Failure};
use crate::probe::{Equivalence, Found, Prober};

/// What one item of the topology is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Role {
    Queue,
    DeadLetterQueue,
    RetryRung,
    Exchange,
    Binding,
}

impl Role {
    fn noun(self) -> &'static str {
        match self {
            Role::Queue | Role::DeadLetterQueue | Role::RetryRung => "queue",
            Role::Exchange => "exchange",
            Role::Binding => "binding",
        }
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
    fn new(role: Role, name: impl Into<String>, state: State) -> Self {
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
    fn is_difference(&self) -> bool {
        !matches!(self.state, State::Same | State::NotRead)
    }

    /// `+ queue q (missing)`, `~ queue q: x-message-ttl differs (...)`,
    /// `= queue q`.
    fn line(&self) -> String {
        let noun = self.role.noun();
        let name = &self.name;
        let said = self.broker_said.as_deref().unwrap_or_default();
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
async fn probe_all(
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
        let missing = |role: Role, name: &str| {
            items.iter().any(|i| {
                i.role.noun() == role.noun() && i.name == name && i.state == State::Missing
            })
        };
        let state = if missing(Role::Queue, &b.queue) || missing(Role::Exchange, &b.exchange) {
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

/// Loads the config, connects, probes.
async fn plan_for(
    config_path: &Path,
    amqp_addr: Option<&str>,
    verb: &str,
) -> Result<(Config, Topology, acemq::lapin::Connection, Plan), Failure> {
    let config = load_config(config_path)?;
    let topology = Topology::from_config(&config);
    let target = Target::new(amqp_addr, Some(&config))?;
    let (conn, broker) = target.connect(verb).await?;
    let mut prober = Prober::new(&conn);
    let plan = probe_all(&mut prober, &config, &topology, broker).await;
    prober.close().await;
    match plan {
        Ok(plan) => Ok((config, topology, conn, plan)),
        Err(e) => {
            let _ = conn.close(200, "OK".into()).await;
            Err(e)
        }
    }
}

fn summary(plan: &Plan) -> String {
    let c = plan.counts();
    let mut parts = vec![
        format!("{} missing", c.missing),
        format!("{} different", c.differs),
    ];
    if c.unchecked > 0 {
        parts.push(format!("{} unchecked", c.unchecked));
    }
    parts.push(format!("{} as configured", c.same));
    if c.bindings_missing > 0 {
        parts.push(format!(
            "{} binding{} missing",
            c.bindings_missing,
            if c.bindings_missing == 1 { "" } else { "s" }
        ));
    }
    if c.bindings_not_read > 0 {
        parts.push(format!(
            "{} binding{} left to apply",
            c.bindings_not_read,
            if c.bindings_not_read == 1 { "" } else { "s" }
        ));
    }
    parts.join(", ")
}

/// `acemq topology plan`: exit 0 when the broker agrees, 1 when not.
pub(crate) async fn plan(
    config: &Path,
    amqp_addr: Option<&str>,
    json: bool,
) -> Result<Exit, Failure> {
    let (_, _, conn, plan) = plan_for(config, amqp_addr, "topology plan").await?;
    let _ = conn.close(200, "OK".into()).await;
    let differs = plan.has_differences();
    if json {
        crate::output::json(&serde_json::json!({
            "broker": plan.broker,
            "config": config.display().to_string(),
            "in_sync": !differs,
            "counts": plan.counts(),
            "items": plan.items,
        }));
    } else {
        for item in &plan.items {
            println!("{}", item.line());
        }
        println!("plan for {}: {}", plan.broker, summary(&plan));
        let c = plan.counts();
        if c.missing + c.bindings_missing > 0 {
            println!(
                "run `acemq topology apply --config {}` to declare what is missing",
                config.display()
            );
        }
        if c.differs > 0 {
            println!(
                "apply does not change a queue or exchange that differs: move its messages and \
                 delete it, or change the config to match it"
            );
        }
    }
    Ok(if differs { Exit::Differences } else { Exit::Ok })
}

/// Why `apply` will not start: the first item that it cannot make right,
/// in the library's words, and the exit code the service would give.
fn refusal(plan: &Plan) -> Option<Failure> {
    for item in &plan.items {
        let said = item.broker_said.clone().unwrap_or_default();
        let failure = match (item.role, item.state) {
            (Role::Exchange, State::Differs) => Failure::config(
                TopologyError::ExchangeConflict {
                    exchange: item.name.clone(),
                    message: said,
                }
                .to_string(),
            ),
            (_, State::Differs) => Failure::config(
                TopologyError::Conflict {
                    queue: item.name.clone(),
                    argument: item.argument.clone().unwrap_or_default(),
                    message: said,
                }
                .to_string(),
            ),
            (Role::Exchange, State::Missing) if item.managed_elsewhere => Failure::config(format!(
                "the config binds to exchange {:?}, which does not exist and which the config \
                 does not declare: add it under exchanges: in the config, or fix the name",
                item.name
            )),
            (_, State::Missing) if item.managed_elsewhere => Failure::unavailable(
                TopologyError::Missing {
                    queue: item.name.clone(),
                    message: said,
                }
                .to_string(),
            ),
            (_, State::Unchecked) => Failure::unavailable(format!(
                "{} {} exists but could not be checked: the broker said {said:?}",
                item.role.noun(),
                item.name
            )),
            _ => continue,
        };
        return Some(failure);
    }
    None
}

/// `acemq topology apply`: declares what is missing, or refuses (exit 78
/// for a conflict) without declaring anything.
pub(crate) async fn apply(
    config: &Path,
    amqp_addr: Option<&str>,
    json: bool,
) -> Result<Exit, Failure> {
    let (_, topology, conn, plan) = plan_for(config, amqp_addr, "topology apply").await?;
    if let Some(mut refused) = refusal(&plan) {
        let _ = conn.close(200, "OK".into()).await;
        if json {
            crate::output::json(&serde_json::json!({
                "broker": plan.broker,
                "applied": false,
                "error": refused.message,
                "items": plan.items,
            }));
        } else {
            for item in plan.items.iter().filter(|i| i.is_difference()) {
                println!("{}", item.line());
            }
        }
        refused.message.push_str(". Nothing was changed.");
        return Err(refused);
    }
    let declared = topology.declare(&conn).await;
    let _ = conn.close(200, "OK".into()).await;
    if let Err(e) = declared {
        let exit = match e {
            TopologyError::Conflict { .. }
            | TopologyError::ExchangeConflict { .. }
            | TopologyError::NoExchange { .. } => Exit::Config,
            _ => Exit::Unavailable,
        };
        return Err(Failure::new(
            exit,
            format!(
                "{e} (what came before it in the config was declared: run `acemq topology plan` to see)"
            ),
        ));
    }
    let created = plan
        .items
        .iter()
        .filter(|i| i.role != Role::Binding && i.state == State::Missing)
        .count();
    let there = plan.items.iter().filter(|i| i.state == State::Same).count();
    let bindings = plan
        .items
        .iter()
        .filter(|i| i.role == Role::Binding)
        .count();
    if json {
        crate::output::json(&serde_json::json!({
            "broker": plan.broker,
            "applied": true,
            "created": created,
            "already_there": there,
            "bindings_applied": bindings,
            "items": plan.items,
        }));
    } else {
        for item in &plan.items {
            let (sign, what) = match (item.role, item.state) {
                (Role::Binding, _) => ('+', "applied"),
                (_, State::Missing) => ('+', "created"),
                _ => ('=', "already there"),
            };
            println!("{sign} {} {} ({what})", item.role.noun(), item.name);
        }
        println!(
            "applied to {}: {created} created, {there} already there, {bindings} binding{} applied",
            plan.broker,
            if bindings == 1 { "" } else { "s" }
        );
    }
    Ok(Exit::Ok)
}
