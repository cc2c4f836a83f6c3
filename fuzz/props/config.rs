//! The `config` target's property: arbitrary text through the config
//! loaders (YAML, TOML or JSON, chosen by the first byte: `t` TOML, `j`
//! JSON, anything else YAML), then `validate()`. Nothing may panic; a
//! config the loader accepts keeps every promise of `Config::validate`'s
//! docs, and its topology builds.
//!
//! Shared by `fuzz/fuzz_targets/config.rs` and the replay test
//! (`tests/fuzz_corpus.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use acemq::config::{AckBatch, ArgValue, Config, RetriesConfig};
use acemq::connection::{check_address, ConnectOptions};
use acemq::topology::Topology;

/// The longest queue name RabbitMQ accepts (an AMQP short string).
const MAX_NAME: usize = 255;

/// The format the first byte selects, and the text after it.
pub(crate) fn split(data: &[u8]) -> Option<(u8, String)> {
    let (&selector, rest) = data.split_first()?;
    Some((selector, String::from_utf8_lossy(rest).into_owned()))
}

/// The property, on raw bytes (the fuzz target and the replay both call
/// this).
pub(crate) fn check(data: &[u8]) {
    let Some((selector, text)) = split(data) else {
        return;
    };
    let loaded = match selector {
        b't' => Config::from_toml_str(&text),
        b'j' => Config::from_json_str(&text),
        _ => Config::from_yaml_str(&text),
    };
    match loaded {
        Ok(config) => check_valid(&config),
        Err(e) => {
            // The message names what is wrong: never empty.
            assert!(!e.to_string().is_empty());
            let _ = e.field();
        }
    }
}

/// What `Config::validate`'s docs promise of a config it accepts, and what
/// the code that consumes it relies on.
pub(crate) fn check_valid(config: &Config) {
    config.validate().expect("a loaded config validates again");
    let _ = config.host_deadline_warning();
    let _ = ConnectOptions::from_config(config);

    assert!(!config.shutdown_timeout.is_zero());
    for d in [
        config.shutdown_timeout,
        config.abandon_after,
        config.host_timeout,
    ] {
        assert!(d <= Config::MAX_DRAIN_DURATION, "{d:?}");
    }
    assert!(config.connect_timeout <= Config::MAX_CONNECT_TIMEOUT);
    assert!(config.pause_hand_back_after <= Config::MAX_PAUSE_HAND_BACK_AFTER);
    assert!(!config.connect_timeout.is_zero());
    for entry in &config.addresses {
        let one = url::Url::parse(entry).is_ok_and(|u| {
            u.has_host()
                && (u.username().contains(',') || u.password().is_some_and(|p| p.contains(',')))
        });
        assert!(!one, "an address that a list would split: {entry:?}");
        for addr in entry.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            check_address(addr).expect("every address was checked");
        }
    }
    if let Some(h) = config.heartbeat {
        assert!(
            (1..=u64::from(u16::MAX)).contains(&h.as_secs()),
            "heartbeat {h:?}"
        );
    }
    if let Some(tls) = &config.tls {
        assert_eq!(tls.cert_file.is_some(), tls.key_file.is_some());
    }

    assert!(!config.queues.is_empty());
    for (i, q) in config.queues.iter().enumerate() {
        let name = &q.name;
        assert!(!name.is_empty());
        assert!(
            !name.chars().any(|c| c.is_whitespace() || c.is_control()),
            "{name:?}"
        );
        assert!(!name.starts_with("amq."), "{name:?}");
        assert!(
            config.queues[..i].iter().all(|p| p.name != *name),
            "{name:?} repeated"
        );
        assert!(config
            .queue(name)
            .is_some_and(|found| std::ptr::eq(found, q)));
        assert!(q.prefetch > 0);
        assert!(q.concurrency > 0);
        // A concurrency above prefetch is refused when it was written; the
        // default (8) beside a smaller prefetch loads (validate_limits.rs).
        assert!(
            q.concurrency <= usize::from(q.prefetch)
                || q.concurrency == acemq::config::QueueConfig::DEFAULT_CONCURRENCY,
            "{q:?}"
        );
        assert!(q.max_redeliveries > 0);
        if let Some(delay) = q.ack_batch.delay {
            assert!(delay <= AckBatch::MAX_DELAY, "{delay:?}");
        }
        if let Some(r) = &q.retries {
            assert!(r.max_attempts >= 1);
            assert!(r.max_attempts <= RetriesConfig::MAX_ATTEMPTS);
            for d in [r.initial_delay, r.max_delay, r.broker_wait_threshold] {
                assert!(d <= RetriesConfig::MAX_DELAY, "{r:?}");
            }
            assert!(!r.initial_delay.is_zero());
            assert!(r.max_delay >= r.initial_delay, "{r:?}");
            let policy = q.policy();
            assert_eq!(policy.max_attempts, r.max_attempts);
            for n in 1..r.max_attempts.min(64) {
                let d = policy.delay_after(n);
                // At most max_delay; at least initial_delay, unless that is
                // beyond what a Duration of u64 nanoseconds holds (584 years).
                assert!(d <= r.max_delay, "{d:?}");
                assert!(
                    d >= r.initial_delay || d == Duration::from_nanos(u64::MAX),
                    "{d:?}"
                );
            }
        }
        let rungs = q.rungs();
        let mut last = Duration::ZERO;
        for (rung, delay) in &rungs {
            assert!(rung.starts_with(&format!("{name}.retry.")), "{rung}");
            assert!(rung.len() <= MAX_NAME, "{rung}");
            assert!(delay.as_millis() <= u128::from(u32::MAX), "{delay:?}");
            assert!(*delay > last, "rungs in increasing order");
            last = *delay;
        }
        assert_eq!(q.dlq_name(), format!("{name}.dlq"));
        if q.dead_letter {
            assert!(q.dlq_name().len() <= MAX_NAME);
        }
        assert!(name.len() <= MAX_NAME);
        if q.passive {
            assert!(q.bindings.is_empty() && q.arguments.is_empty());
        }
        assert!(!q.arguments.contains_key("x-queue-type"));
        if q.dead_letter {
            assert!(!q.arguments.contains_key("x-dead-letter-exchange"));
            assert!(!q.arguments.contains_key("x-dead-letter-routing-key"));
        }
        let (count, delay) = q.ack_batch.bounds(q.prefetch);
        if q.ack_batch.count.is_none() {
            assert!(
                (1..=AckBatch::DEFAULT_MAX_COUNT).contains(&count),
                "{count}"
            );
        }
        if q.ack_batch.delay.is_none() {
            assert_eq!(delay, AckBatch::DEFAULT_DELAY);
        }
        for b in &q.bindings {
            assert!(!b.exchange.is_empty());
            assert!(
                b.exchange.starts_with("amq.")
                    || config.exchanges.iter().any(|x| x.name == b.exchange),
                "{:?} is bound but not declared",
                b.exchange
            );
        }
    }
    for (i, x) in config.exchanges.iter().enumerate() {
        assert!(
            !x.name.is_empty() && !x.name.starts_with("amq."),
            "{:?}",
            x.name
        );
        assert!(config.exchanges[..i].iter().all(|e| e.name != x.name));
        assert!(!x.kind.as_str().is_empty());
    }

    assert!(
        names_fit(config),
        "every name AMQP carries is a short string"
    );
    assert!(!names_a_derived_queue(config));
    check_topology(config);
}

/// Whether every name `Topology::from_config` turns into an AMQP short
/// string fits one: argument names (queues' and bindings'), exchange names
/// and routing keys.
fn names_fit(config: &Config) -> bool {
    let fit = |args: &BTreeMap<String, ArgValue>| args.keys().all(|k| k.len() <= MAX_NAME);
    config.exchanges.iter().all(|x| x.name.len() <= MAX_NAME)
        && config.queues.iter().all(|q| {
            fit(&q.arguments)
                && q.bindings.iter().all(|b| {
                    fit(&b.arguments)
                        && b.exchange.len() <= MAX_NAME
                        && b.routing_keys.iter().all(|k| k.len() <= MAX_NAME)
                })
        })
}

/// Whether a queue of the config has the name of another queue's
/// dead-letter queue or rung.
fn names_a_derived_queue(config: &Config) -> bool {
    config.queues.iter().any(|q| {
        let mut derived: Vec<String> = q.rungs().into_iter().map(|(n, _)| n).collect();
        if q.dead_letter {
            derived.push(q.dlq_name());
        }
        derived
            .iter()
            .any(|d| config.queues.iter().any(|other| other.name == *d))
    })
}

/// The declarations of a valid config: every queue once per name, with its
/// dead-letter queue and rungs, and its bindings.
fn check_topology(config: &Config) {
    let topology = Topology::from_config(config);
    assert_eq!(topology.exchanges().len(), config.exchanges.len());
    let mut decls = 0;
    let mut bindings = 0;
    for q in &config.queues {
        let main = topology.get(&q.name).expect("each queue is declared");
        assert_eq!(main.passive, q.passive);
        if q.dead_letter {
            assert!(topology.get(&q.dlq_name()).is_some());
        }
        for (rung, _) in q.rungs() {
            assert!(topology.get(&rung).is_some(), "{rung}");
        }
        decls += 1 + usize::from(q.dead_letter) + q.rungs().len();
        bindings += q
            .bindings
            .iter()
            .map(|b| b.routing_keys.len().max(1))
            .sum::<usize>();
    }
    assert_eq!(topology.decls().len(), decls);
    assert_eq!(topology.bindings().len(), bindings);
    // A name declared twice is declared the same way both times (a second,
    // different declaration of one queue fails the start with
    // PRECONDITION_FAILED).
    for (i, d) in topology.decls().iter().enumerate() {
        for e in &topology.decls()[..i] {
            if e.name == d.name {
                assert!(
                    e.arguments == d.arguments && e.passive == d.passive,
                    "{:?} is declared twice, differently: {e:?} and {d:?}",
                    d.name
                );
            }
        }
    }
}
