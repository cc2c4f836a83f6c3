//! Loading a [`Config`] from a file or from text in one of the formats.

use std::path::Path;

use super::error::{ConfigError, Format};
use super::schema::Config;

impl Config {
    /// Reads, parses and validates a config file, choosing the format by its
    /// extension: `.yaml`/`.yml`, `.toml` or `.json`.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let format = Format::from_path(path).ok_or_else(|| ConfigError::UnknownFormat {
            path: path.to_path_buf(),
        })?;
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text, format, Some(path))
    }

    /// Parses and validates a config given as text in `format`.
    #[allow(clippy::should_implement_trait)] // two arguments: not `FromStr`
    pub fn from_str(text: &str, format: Format) -> Result<Config, ConfigError> {
        Config::parse(text, format, None)
    }

    /// Parses and validates a YAML config.
    pub fn from_yaml_str(text: &str) -> Result<Config, ConfigError> {
        Config::from_str(text, Format::Yaml)
    }

    /// Parses and validates a TOML config.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        Config::from_str(text, Format::Toml)
    }

    /// Parses and validates a JSON config.
    pub fn from_json_str(text: &str) -> Result<Config, ConfigError> {
        Config::from_str(text, Format::Json)
    }

    fn parse(text: &str, format: Format, path: Option<&Path>) -> Result<Config, ConfigError> {
        let parsed = match format {
            Format::Yaml => serde_yaml_ng::from_str::<Config>(text).map_err(|e| e.to_string()),
            Format::Toml => toml::from_str::<Config>(text).map_err(|e| one_line_toml(text, &e)),
            Format::Json => serde_json::from_str::<Config>(text).map_err(|e| e.to_string()),
        };
        let config = parsed.map_err(|message| ConfigError::Parse {
            path: path.map(Path::to_path_buf),
            format,
            message: message.trim_end().to_owned(),
        })?;
        config.validate()?;
        Ok(config)
    }
}

/// A TOML error on one line: where (line and column, from 1) and what. The
/// parser's own text quotes the line over several.
fn one_line_toml(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
    match e.span() {
        Some(span) => {
            let before = text.get(..span.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("{message} at line {line}, column {column}")
        }
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use crate::config::test_support::{one_queue, rejected};
    use crate::config::*;

    /// The YAML of DESIGN.md's Config section, the seed's queue with the
    /// prefetch and concurrency the design gives it.
    const DESIGN_YAML: &str = "\
shutdown_timeout: 20
queues:
  - name: shop.orders
    prefetch: 20
    concurrency: 4
    dead_letter: true
    retries: { max_attempts: 5, initial_delay: 10, max_delay: 300, broker_wait_threshold: 10 }
";

    /// The YAML of seeds/ruby-shutdown-and-drain.txt, verbatim.
    const SEED_YAML: &str = "\
queues:
  - name: shop.orders
    dead_letter: true
    retries:
      max_attempts: 5
      initial_delay: 10
      max_delay: 300
      broker_wait_threshold: 10
";

    fn shop_path() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/shop.yaml")
    }

    #[test]
    fn the_designs_yaml_loads_unchanged() {
        let config = Config::from_yaml_str(DESIGN_YAML).unwrap();
        assert_eq!(config.shutdown_timeout, Duration::from_secs(20));
        assert_eq!(config.abandon_after, Duration::from_secs(5));
        assert_eq!(config.host_timeout, Duration::from_secs(30));
        assert_eq!(config.connect_timeout, Duration::from_secs(10));
        assert_eq!(config.prefetch_policy, PrefetchPolicy::HandBack);
        let q = &config.queues[0];
        assert_eq!(q.name, "shop.orders");
        assert_eq!(q.kind, QueueType::Classic);
        assert_eq!((q.prefetch, q.concurrency, q.dead_letter), (20, 4, true));
        let retries = q.retries.as_ref().unwrap();
        assert_eq!(retries.max_attempts, 5);
        assert_eq!(retries.initial_delay, Duration::from_secs(10));
        assert_eq!(retries.max_delay, Duration::from_secs(300));
        assert_eq!(retries.broker_wait_threshold, Duration::from_secs(10));
        assert!(!retries.jitter && !retries.retry_panics);
        assert_eq!(q.dlq_name(), "shop.orders.dlq");
        let rungs: Vec<(String, u64)> = q
            .rungs()
            .into_iter()
            .map(|(n, d)| (n, d.as_secs()))
            .collect();
        assert_eq!(
            rungs,
            [
                ("shop.orders.retry.10s".to_owned(), 10),
                ("shop.orders.retry.20s".to_owned(), 20),
                ("shop.orders.retry.40s".to_owned(), 40),
                ("shop.orders.retry.80s".to_owned(), 80),
            ]
        );
    }

    #[test]
    fn the_seeds_yaml_loads_unchanged_with_the_defaults_it_is_silent_on() {
        let config = Config::from_yaml_str(SEED_YAML).unwrap();
        assert_eq!(config.shutdown_timeout, Duration::from_secs(20));
        let q = config.queue("shop.orders").unwrap();
        assert_eq!((q.prefetch, q.concurrency, q.dead_letter), (32, 8, true));
        let with_design_values = Config::from_yaml_str(DESIGN_YAML).unwrap();
        assert_eq!(q.retries, with_design_values.queues[0].retries);
    }

    #[test]
    fn the_same_config_in_toml_and_json_loads_equal() {
        let yaml = Config::from_yaml_str(DESIGN_YAML).unwrap();
        let toml = Config::from_toml_str(
            r#"
shutdown_timeout = 20

[[queues]]
name = "shop.orders"
prefetch = 20
concurrency = 4
dead_letter = true
retries = { max_attempts = 5, initial_delay = 10, max_delay = 300, broker_wait_threshold = 10 }
"#,
        )
        .unwrap();
        let json = Config::from_json_str(
            r#"{
  "shutdown_timeout": 20,
  "queues": [{
    "name": "shop.orders", "prefetch": 20, "concurrency": 4, "dead_letter": true,
    "retries": { "max_attempts": 5, "initial_delay": 10, "max_delay": 300, "broker_wait_threshold": 10 }
  }]
}"#,
        )
        .unwrap();
        assert_eq!(toml, yaml);
        assert_eq!(json, yaml);
    }

    #[test]
    fn every_top_level_key_and_enum_spelling_is_read() {
        let config = Config::from_yaml_str(
            "shutdown_timeout: 6\nabandon_after: 2s\nhost_timeout: 10\nconnect_timeout: 500ms\n\
             prefetch_policy: handle_buffered\n\
             queues:\n  - { name: a, type: quorum }\n  - { name: b, type: classic }\n",
        )
        .unwrap();
        assert_eq!(config.abandon_after, Duration::from_secs(2));
        assert_eq!(config.connect_timeout, Duration::from_millis(500));
        assert_eq!(config.prefetch_policy, PrefetchPolicy::HandleBuffered);
        assert_eq!(config.queues[0].kind, QueueType::Quorum);
        assert_eq!(config.queues[0].kind.as_str(), "quorum");
        assert_eq!(config.queues[1].kind, QueueType::Classic);
        assert!(config.queue("c").is_none());
    }

    #[test]
    fn examples_shop_yaml_loads_and_gives_two_rungs() {
        let config = Config::from_path(shop_path()).unwrap();
        assert_eq!(config.shutdown_timeout, Duration::from_secs(20));
        let q = config.queue("shop.orders").unwrap();
        assert_eq!((q.prefetch, q.concurrency, q.dead_letter), (20, 4, true));
        let policy = q.policy();
        assert_eq!(policy.max_attempts, 4);
        assert_eq!(policy.broker_wait_threshold, Duration::from_secs(2));
        assert_eq!(
            q.rungs(),
            [
                ("shop.orders.retry.2s".to_owned(), Duration::from_secs(2)),
                ("shop.orders.retry.4s".to_owned(), Duration::from_secs(4)),
            ]
        );
        assert!(config.host_deadline_warning().is_none());
    }

    #[test]
    fn an_unknown_key_is_rejected_naming_the_key() {
        let top = rejected(&format!("shutdown_timout: 20\n{}", one_queue("name: q"))).to_string();
        assert!(top.contains("shutdown_timout"), "{top}");
        let queue = rejected(&one_queue("{ name: q, prefetchh: 4 }")).to_string();
        assert!(queue.contains("prefetchh"), "{queue}");
        let retries = rejected(&one_queue(
            "{ name: q, retries: { max_attempts: 2, initial_delay: 1, max_delay: 2, jiter: true } }",
        ))
        .to_string();
        assert!(retries.contains("jiter"), "{retries}");
        let toml = Config::from_toml_str("[[queues]]\nname = \"q\"\nprefetchh = 4\n")
            .unwrap_err()
            .to_string();
        assert!(
            toml.contains("prefetchh") && toml.contains("line 3"),
            "{toml}"
        );
        assert!(!toml.contains('\n'), "one line: {toml}");
        let json = Config::from_json_str(r#"{"queues":[{"name":"q","prefetchh":4}]}"#)
            .unwrap_err()
            .to_string();
        assert!(
            json.contains("prefetchh") && json.contains("line 1"),
            "{json}"
        );
    }

    #[test]
    fn a_parse_error_from_a_file_names_the_file_and_the_line() {
        let path =
            std::env::temp_dir().join(format!("acemq-config-test-{}.yaml", std::process::id()));
        std::fs::write(&path, "queues:\n  - name: q\n    prefetch: lots\n").unwrap();
        let err = Config::from_path(&path).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains("line 3"), "{message}");
        assert!(message.contains("YAML"), "{message}");
    }

    #[test]
    fn a_missing_file_or_an_unknown_extension_is_an_error_saying_what_to_do() {
        let missing = Config::from_path("/nonexistent/acemq.yaml").unwrap_err();
        assert!(matches!(missing, ConfigError::Io { .. }), "{missing}");
        assert!(missing.to_string().contains("/nonexistent/acemq.yaml"));
        let ini = Config::from_path("acemq.ini").unwrap_err().to_string();
        assert!(
            ini.contains("acemq.ini") && ini.contains(".yaml, .yml, .toml or .json"),
            "{ini}"
        );
        assert_eq!(Format::from_path(Path::new("a/B.YML")), Some(Format::Yaml));
        assert_eq!(Format::from_path(Path::new("noext")), None);
    }
}
