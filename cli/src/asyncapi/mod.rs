//! `acemq asyncapi`: the AsyncAPI 3.0 document of a config, in YAML or
//! JSON, on stdout or in a file. Nothing is asked of the broker.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use acemq::config::Config;
use serde_json::Value;

use crate::cli::{AsyncApiArgs, DocFormat};
use crate::connect::load_config;
use crate::exit::{Exit, Failure};

mod document;
mod headers;

/// `acemq asyncapi`: exit 0 with the document written, 78 when the config
/// or a `schema:` file it names is wrong.
pub(crate) fn asyncapi(args: &AsyncApiArgs, json: bool) -> Result<Exit, Failure> {
    let config_path = &args.config.config;
    let config = load_config(config_path)?;
    let schemas = read_schemas(&config, config_path)?;
    let title = args.title.clone().unwrap_or_else(|| {
        config_path
            .file_stem()
            .map_or_else(|| "acemq".to_owned(), |s| s.to_string_lossy().into_owned())
    });
    let vhost = vhost_of(&config);
    let meta = document::Meta {
        title: &title,
        version: &args.api_version,
        vhost: &vhost,
    };
    let doc = document::document(&config, &schemas, &meta);
    let format = args.format.unwrap_or(if json {
        DocFormat::Json
    } else {
        DocFormat::Yaml
    });
    let text = match format {
        DocFormat::Json => serde_json::to_string_pretty(&doc)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .map_err(|e| e.to_string()),
        DocFormat::Yaml => serde_yaml_ng::to_string(&doc).map_err(|e| e.to_string()),
    }
    .map_err(|e| Failure::new(Exit::Config, format!("could not write the document: {e}")))?;
    match &args.output {
        None => print!("{text}"),
        Some(path) => std::fs::write(path, text).map_err(|e| {
            Failure::usage(format!(
                "cannot write {}: {e}; give --output a file in a directory that exists and is writable",
                path.display()
            ))
        })?,
    }
    Ok(Exit::Ok)
}

/// Each queue's `schema:` file, relative to the config file, read and
/// parsed as JSON; a missing or malformed one is exit 78, naming the queue
/// and the file.
fn read_schemas(config: &Config, config_path: &Path) -> Result<BTreeMap<String, Value>, Failure> {
    let base = config_path.parent().unwrap_or(Path::new(""));
    let mut out = BTreeMap::new();
    for (i, q) in config.queues.iter().enumerate() {
        let Some(rel) = &q.schema else { continue };
        let path: PathBuf = base.join(rel);
        let key = format!("queues[{i}].schema ({})", q.name);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Failure::config(format!(
                "invalid config: {key}: cannot read {}: {e}; give the path of a JSON Schema file, \
                 relative to the config file",
                path.display()
            ))
        })?;
        let schema: Value = serde_json::from_str(&text).map_err(|e| {
            Failure::config(format!(
                "invalid config: {key}: {} is not JSON ({e}); give a JSON Schema file",
                path.display()
            ))
        })?;
        if !schema.is_object() && !schema.is_boolean() {
            return Err(Failure::config(format!(
                "invalid config: {key}: {} is not a JSON Schema (an object or a boolean)",
                path.display()
            )));
        }
        out.insert(q.name.clone(), schema);
    }
    Ok(out)
}

/// The virtual host of the config's first address (`/` without one).
fn vhost_of(config: &Config) -> String {
    let Some(addr) = config.addresses.first() else {
        return "/".to_owned();
    };
    let rest = addr.split_once("://").map_or(addr.as_str(), |(_, r)| r);
    let path = rest.split_once('/').map_or("", |(_, p)| p);
    let path = path.split(['?', '#']).next().unwrap_or("");
    if path.is_empty() {
        return "/".to_owned();
    }
    percent_decode(path)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vhost_is_the_first_addresses_path() {
        let mut config = Config::from_yaml_str("queues: [{ name: q }]").unwrap();
        assert_eq!(vhost_of(&config), "/");
        config.addresses = vec!["amqp://u:p@h:5672/%2f".to_owned()];
        assert_eq!(vhost_of(&config), "/");
        config.addresses = vec!["amqp://u:p@h:5672/shop".to_owned()];
        assert_eq!(vhost_of(&config), "shop");
        config.addresses = vec!["amqp://h".to_owned()];
        assert_eq!(vhost_of(&config), "/");
    }
}
