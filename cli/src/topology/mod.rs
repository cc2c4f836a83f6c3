//! `acemq topology plan` and `acemq topology apply`.
//!
//! Both start from [`Topology::from_config`], the declarations the service
//! itself makes, so the command and the library never disagree about what a
//! config means. `plan` probes each one ([`plan::probe_all`]) and changes
//! nothing; `apply` plans first, refuses when anything conflicts (nothing is
//! declared then), and otherwise declares through [`Topology::declare`].

use std::path::Path;

use acemq::connection::close_connection;
use acemq::lapin::Connection;
use acemq::topology::{Topology, TopologyError};

use crate::connect::{load_config, Target};
use crate::exit::{Exit, Failure};
use crate::probe::Prober;

mod plan;

use plan::{probe_all, Plan, Role, State};

/// Loads the config, connects, probes.
async fn plan_for(
    config_path: &Path,
    amqp_addr: Option<&str>,
    verb: &str,
) -> Result<(Topology, Connection, Plan), Failure> {
    let config = load_config(config_path)?;
    let topology = Topology::from_config(&config);
    let target = Target::new(amqp_addr, Some(&config))?;
    let (conn, broker) = target.connect(verb).await?;
    let mut prober = Prober::new(&conn);
    let plan = probe_all(&mut prober, &config, &topology, broker).await;
    prober.close().await;
    match plan {
        Ok(plan) => Ok((topology, conn, plan)),
        Err(e) => {
            let _ = close_connection(&conn, "OK").await;
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
    let (_, conn, plan) = plan_for(config, amqp_addr, "topology plan").await?;
    let _ = close_connection(&conn, "OK").await;
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
        for line in advice(&plan, config) {
            println!("{line}");
        }
    }
    Ok(if differs { Exit::Differences } else { Exit::Ok })
}

/// What the plan's reader can do next: never "run apply" when apply would
/// refuse (a difference, or something missing that the config leaves to
/// others to declare).
fn advice(plan: &Plan, config: &Path) -> Vec<String> {
    let c = plan.counts();
    let mut lines = Vec::new();
    if c.differs > 0 {
        lines.push(
            "apply does not change a queue or exchange that differs: move its messages and \
             delete it, or change the config to match it"
                .to_owned(),
        );
    }
    match refusal(plan) {
        Some(_) if c.differs > 0 => {}
        Some(refused) => lines.push(format!(
            "`acemq topology apply` would refuse until this is fixed: {}",
            refused.message
        )),
        None if c.missing + c.bindings_missing > 0 => lines.push(format!(
            "run `acemq topology apply --config {}` to declare what is missing",
            config.display()
        )),
        None => {}
    }
    lines
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
    let (topology, conn, plan) = plan_for(config, amqp_addr, "topology apply").await?;
    if let Some(mut refused) = refusal(&plan) {
        let _ = close_connection(&conn, "OK").await;
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
    let _ = close_connection(&conn, "OK").await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use plan::Item;

    fn plan_with(role: Role, state: State, managed_elsewhere: bool) -> Plan {
        let mut item = Item::new(role, "shop.orders", state);
        item.managed_elsewhere = managed_elsewhere;
        item.argument = Some("x-message-ttl".into());
        item.broker_said = Some("PRECONDITION_FAILED - inequivalent arg".into());
        Plan {
            broker: String::new(),
            items: vec![item],
        }
    }

    #[test]
    fn apply_refuses_as_the_service_would_exit() {
        let conflict = refusal(&plan_with(Role::Queue, State::Differs, false)).unwrap();
        assert_eq!(conflict.exit, Exit::Config);
        assert!(conflict
            .message
            .contains("queue \"shop.orders\" already exists with a different x-message-ttl"));
        let exchange = refusal(&plan_with(Role::Exchange, State::Differs, false)).unwrap();
        assert_eq!(exchange.exit, Exit::Config);
        let passive = refusal(&plan_with(Role::Queue, State::Missing, true)).unwrap();
        assert_eq!(passive.exit, Exit::Unavailable);
        let amq = refusal(&plan_with(Role::Exchange, State::Missing, true)).unwrap();
        assert_eq!(amq.exit, Exit::Config);
        assert!(refusal(&plan_with(Role::Queue, State::Missing, false)).is_none());
        assert!(refusal(&plan_with(Role::Binding, State::NotRead, false)).is_none());
    }

    #[test]
    fn the_plan_never_says_to_run_apply_when_apply_would_refuse() {
        let path = Path::new("shop.yaml");
        let elsewhere = advice(&plan_with(Role::Queue, State::Missing, true), path);
        assert_eq!(elsewhere.len(), 1, "{elsewhere:?}");
        assert!(elsewhere[0].contains("would refuse"), "{elsewhere:?}");
        assert!(
            !elsewhere[0].contains("to declare what is missing"),
            "{elsewhere:?}"
        );
        let ours = advice(&plan_with(Role::Queue, State::Missing, false), path);
        assert_eq!(
            ours,
            ["run `acemq topology apply --config shop.yaml` to declare what is missing"]
        );
        let differs = advice(&plan_with(Role::Queue, State::Differs, false), path);
        assert_eq!(differs.len(), 1, "{differs:?}");
        assert!(
            differs[0].starts_with("apply does not change"),
            "{differs:?}"
        );
    }

    #[test]
    fn a_plan_line_shows_what_the_broker_said_escaped() {
        let mut item = Item::new(Role::Queue, "q\x1b[2J", State::Differs);
        item.broker_said = Some("PRECONDITION_FAILED\nERROR forged".into());
        let line = item.line();
        assert!(!line.chars().any(char::is_control), "{line}");
        assert!(line.contains("q\\u{1b}[2J"), "{line}");
    }
}
