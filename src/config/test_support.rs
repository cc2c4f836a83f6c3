//! Helpers the config's unit tests share: YAML for a config of one queue,
//! and what the loaders say about a config they reject.

use super::error::ConfigError;
use super::schema::Config;

pub(super) fn one_queue(queue: &str) -> String {
    format!("queues:\n  - {queue}\n")
}

pub(super) fn rejected(yaml: &str) -> ConfigError {
    match Config::from_yaml_str(yaml) {
        Ok(config) => panic!("accepted {yaml:?} as {config:?}"),
        Err(e) => e,
    }
}

pub(super) fn assert_invalid(yaml: &str, field: &str) -> String {
    let err = rejected(yaml);
    let message = err.to_string();
    assert_eq!(err.field(), Some(field), "{message}");
    assert!(
        message.starts_with(&format!("invalid config: {field} ")),
        "{message}"
    );
    message
}
