//! The delivery limit acemq gives its quorum queues, and what happens when
//! a queue already exists without it.
//!
//! Quorum queues count returns (`x-delivery-count`) and dead-letter or drop
//! a message past their delivery limit: none on RabbitMQ 3.x unless set, 20
//! by default since 4.0. acemq bounds returns itself at `max_redeliveries`
//! (reason `redelivered`), so it declares its quorum queues with
//! `x-delivery-limit` = `max_redeliveries` + [`MARGIN`]: its own bound fires
//! first, and the broker's is the backstop (a process that crashes while
//! dead-lettering, a delivery handed back before the bound was read). A
//! quorum `Q.dlq` gets [`DLQ_LIMIT`]: nothing consumes it in a loop, but
//! repeated peeks would otherwise reach 4.x's default of 20, and a
//! dead-letter queue has no dead-letter exchange of its own: the message
//! would be dropped. A limit in the queue's own `arguments` wins.
//!
//! RabbitMQ checks `x-delivery-limit` for equivalence when a queue is
//! declared again (3.10.8 too), so a queue created without it — by an
//! earlier acemq, or elsewhere — would refuse the declaration with 406
//! PRECONDITION_FAILED. Such a queue keeps working: the declaration is
//! repeated with the limit the queue has (or none), every other argument
//! still checked, and acemq warns once per queue and process with the
//! `rabbitmqctl set_policy` command that gives it a limit. It is never a
//! startup error.

use crate::sync::Locked;
use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock};

use lapin::types::{AMQPValue, ShortString};

/// The queue argument.
pub(crate) const ARGUMENT: &str = "x-delivery-limit";

/// How far above `max_redeliveries` acemq puts a quorum queue's limit.
pub(crate) const MARGIN: u32 = 10;

/// The delivery limit of a quorum dead-letter queue acemq creates.
pub(crate) const DLQ_LIMIT: i64 = 10_000;

/// The limit acemq wants on one queue, and the least an existing queue's
/// own limit must be for acemq's bound to fire first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// What acemq declares.
    pub(crate) limit: i64,
    /// An existing queue with a limit below this (or none) gets the
    /// warning.
    pub(crate) floor: i64,
}

impl Wanted {
    /// A consumed quorum queue bounded at `max_redeliveries`.
    pub(crate) fn main(max_redeliveries: u32) -> Self {
        Wanted {
            limit: i64::from(max_redeliveries) + i64::from(MARGIN),
            floor: i64::from(max_redeliveries) + 1,
        }
    }

    /// A quorum dead-letter queue: any limit of its own is kept.
    pub(crate) fn dlq() -> Self {
        Wanted {
            limit: DLQ_LIMIT,
            floor: 1,
        }
    }

    /// The argument to declare.
    pub(crate) fn argument(&self) -> (ShortString, AMQPValue) {
        (
            ShortString::from(ARGUMENT),
            AMQPValue::LongLongInt(self.limit),
        )
    }
}

/// The limit an existing queue has, read from the broker's 406 text
/// (`... but current is none` or `... but current is the value '20' of type
/// 'long'`). `None` inside: it has none. `None` outside: the text says
/// neither (the caller then checks the queue passively).
pub(crate) fn current_limit(message: &str) -> Option<Option<i64>> {
    let rest = message.split("but current is ").nth(1)?;
    if rest.starts_with("none") {
        return Some(None);
    }
    let value = rest.strip_prefix("the value '")?.split('\'').next()?;
    value.parse().ok().map(Some)
}

/// Whether an existing queue's limit leaves acemq's bound to fire first
/// (`-1`: no limit, on RabbitMQ 4.x).
pub(crate) fn enough(current: Option<i64>, wanted: Wanted) -> bool {
    matches!(current, Some(n) if n < 0 || n >= wanted.floor)
}

/// The command that gives `queue` the limit acemq wants, as a policy
/// matching that queue alone. `--apply-to queues`: RabbitMQ 3.10 refuses
/// `quorum_queues` (it knows `queues`, `exchanges` and `all`), and the
/// pattern names one quorum queue anyway.
pub(crate) fn policy_command(queue: &str, limit: i64) -> String {
    let mut pattern = String::from("^");
    for c in queue.chars() {
        if "\\^$.|?*+()[]{}".contains(c) {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('$');
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    format!(
        "rabbitmqctl set_policy {} {} '{{\"delivery-limit\":{limit}}}' --apply-to queues",
        quote(&format!("acemq-delivery-limit-{queue}")),
        quote(&pattern),
    )
}

/// Warns, once per queue and process, that `queue` exists with `current`
/// (no limit, or one too low) and how to give it `wanted`.
pub(crate) fn warn_once(queue: &str, current: Option<i64>, wanted: Wanted) {
    static WARNED: OnceLock<Mutex<BTreeSet<String>>> = OnceLock::new();
    let first = WARNED
        .get_or_init(Mutex::default)
        .locked()
        .insert(queue.to_owned());
    if !first {
        return;
    }
    let command = policy_command(queue, wanted.limit);
    let has = match current {
        None => "without x-delivery-limit".to_owned(),
        Some(n) => format!("with x-delivery-limit {n}"),
    };
    tracing::warn!(
        queue = %queue,
        delivery_limit = ?current,
        wanted = wanted.limit,
        "quorum queue {queue:?} exists {has} (created by an earlier acemq, or elsewhere); the \
         broker checks that argument when a queue is declared again, so acemq declares it as it \
         is and consumes it. Its delivery limit is then the broker's (RabbitMQ 4.x: 20 unless a \
         policy sets one), which can dead-letter or drop a message returned that often before \
         acemq's own bound (max_redeliveries) dead-letters it with reason redelivered. Give it a \
         limit of {} with a policy: {command} (a queue follows one policy, the one of highest \
         priority: if another already applies to it, add \"delivery-limit\":{} to that one)",
        wanted.limit,
        wanted.limit
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_limit_is_read_from_both_brokers_refusals() {
        // RabbitMQ 4.0.5 and 3.10.8 word it alike.
        let none = "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in \
                    vhost '/': received the value '60' of type 'long' but current is none";
        assert_eq!(current_limit(none), Some(None));
        let some = "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'q' in \
                    vhost '/': received the value '60' of type 'long' but current is the value \
                    '20' of type 'long'";
        assert_eq!(current_limit(some), Some(Some(20)));
        assert_eq!(current_limit("PRECONDITION_FAILED - something else"), None);
    }

    #[test]
    fn the_main_limit_is_above_the_bound_and_an_existing_one_is_judged_by_it() {
        let w = Wanted::main(50);
        assert_eq!(w.limit, 60);
        assert!(!enough(None, w), "none: 20 on RabbitMQ 4");
        assert!(!enough(Some(20), w));
        assert!(!enough(Some(50), w), "the broker would fire at the bound");
        assert!(enough(Some(51), w));
        assert!(enough(Some(-1), w), "unlimited");
        assert!(
            enough(Some(5), Wanted::dlq()),
            "a dead-letter queue's own limit is kept"
        );
    }

    #[test]
    fn the_policy_command_matches_that_queue_alone() {
        assert_eq!(
            policy_command("shop.orders", 60),
            r#"rabbitmqctl set_policy 'acemq-delivery-limit-shop.orders' '^shop\.orders$' '{"delivery-limit":60}' --apply-to queues"#
        );
        assert_eq!(
            policy_command("it's", 1),
            r#"rabbitmqctl set_policy 'acemq-delivery-limit-it'\''s' '^it'\''s$' '{"delivery-limit":1}' --apply-to queues"#
        );
    }
}
