//! What goes wrong loading a config: [`ConfigError`], and the [`Format`]
//! a config was parsed as.

use std::fmt;
use std::path::{Path, PathBuf};

/// A config file format.
///
/// ```
/// use std::path::Path;
/// use acemq::config::{Config, Format};
///
/// assert_eq!(Format::from_path(Path::new("app.yml")), Some(Format::Yaml));
/// let config = Config::from_str("[[queues]]\nname = \"q\"", Format::Toml).unwrap();
/// assert_eq!(config.queues[0].name, "q");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// YAML, extension `.yaml` or `.yml`.
    Yaml,
    /// TOML, extension `.toml`.
    Toml,
    /// JSON, extension `.json`.
    Json,
}

impl Format {
    /// The format a file's extension names (case-insensitive), if any.
    pub fn from_path(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "yaml" | "yml" => Some(Format::Yaml),
            "toml" => Some(Format::Toml),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Yaml => "YAML",
            Format::Toml => "TOML",
            Format::Json => "JSON",
        })
    }
}

/// A config that could not be read, parsed or accepted.
///
/// ```
/// use acemq::config::{Config, ConfigError};
///
/// let err = Config::from_yaml_str("queues: [{ name: q, prefetch: 0 }]").unwrap_err();
/// assert!(matches!(err, ConfigError::Invalid { .. }));
/// assert_eq!(err.field(), Some("queues[0].prefetch"));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file's extension names no format this crate reads.
    #[error(
        "cannot tell the format of config file {}: name it .yaml, .yml, .toml or .json",
        path.display()
    )]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },
    /// The text is not valid in its format, or does not match the struct
    /// (wrong type, unknown key, missing required key).
    #[error(
        "cannot parse {format} config{}: {message}",
        path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default()
    )]
    Parse {
        /// The file, when the config came from one.
        path: Option<PathBuf>,
        /// The format it was parsed as.
        format: Format,
        /// The parser's message, with the line and column where it gives them.
        message: String,
    },
    /// The config parsed but a value is not usable.
    #[error("invalid config: {field} {problem}: {fix}")]
    Invalid {
        /// The path of the offending field, e.g. `queues[0].prefetch`.
        field: String,
        /// What is wrong with it, e.g. `is 0`.
        problem: String,
        /// What to do about it.
        fix: String,
    },
}

impl ConfigError {
    /// The path of the offending field (e.g. `queues[0].prefetch`) for an
    /// [`Invalid`](ConfigError::Invalid) config; `None` otherwise.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }

    pub(crate) fn invalid(
        field: impl Into<String>,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            problem: problem.into(),
            fix: fix.into(),
        }
    }
}
