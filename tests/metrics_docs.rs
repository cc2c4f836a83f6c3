//! The operators' documents agree with the code, without a broker:
//!
//! - every metric `src/` and `layers/src/` register (`counter!`, `gauge!`,
//!   `histogram!` with a literal `"acemq.…"` name, found by reading the
//!   source text) is in docs/metrics.md's table with its type and labels,
//!   and the table lists no other;
//! - every `acemq_…` name in docs/prometheus/acemq.rules.yml and
//!   docs/grafana/acemq.json maps back to a registered metric (dots as
//!   underscores, `_total` on a counter, `_bucket`/`_sum`/`_count` on a
//!   histogram) and is one metrics-exporter-prometheus renders (its
//!   default naming, with or without buckets: the rules file says why);
//! - docs/k8s/: the grace period is the config's `host_timeout`, the drain
//!   fits in it, the probes name routes the admin router serves, and the
//!   ScaledObject scales that Deployment on a queue it consumes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::Value as Json;
use serde_yaml_ng::Value as Yaml;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    const ALL: [(&'static str, Kind); 3] = [
        ("counter", Kind::Counter),
        ("gauge", Kind::Gauge),
        ("histogram", Kind::Histogram),
    ];
}

#[derive(Debug)]
struct Metric {
    kind: Kind,
    labels: BTreeSet<String>,
    /// `file:line` of every registration, for the failure messages.
    sites: Vec<String>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The string literal starting at `text[at]` (a `"`): its content and the
/// index just past its closing quote.
fn string_literal(text: &str, at: usize) -> (String, usize) {
    let bytes = text.as_bytes();
    debug_assert_eq!(bytes[at], b'"');
    let mut i = at + 1;
    while bytes[i] != b'"' {
        i += if bytes[i] == b'\\' { 2 } else { 1 };
    }
    (text[at + 1..i].to_owned(), i + 1)
}

/// One macro call's arguments, from just past its `(`: the string literals
/// among them at depth 0 (with whether `=>` follows each), and whether the
/// first argument is a literal.
fn macro_arguments(text: &str, start: usize) -> (Vec<(String, bool)>, bool) {
    let bytes = text.as_bytes();
    let mut literals = Vec::new();
    let mut first_is_literal = None;
    let mut depth = 0usize;
    let mut i = start;
    loop {
        let c = bytes[i];
        if first_is_literal.is_none() && !c.is_ascii_whitespace() {
            first_is_literal = Some(c == b'"');
        }
        match c {
            b'"' => {
                let (literal, end) = string_literal(text, i);
                let arrow = text[end..].trim_start().starts_with("=>");
                if depth == 0 {
                    literals.push((literal, arrow));
                }
                i = end;
                continue;
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' if depth == 0 => break,
            b')' | b']' | b'}' => depth -= 1,
            _ => {}
        }
        i += 1;
    }
    (literals, first_is_literal.unwrap_or(false))
}

/// Every metric registered in `src/` and `layers/src/`, by name.
fn registered() -> BTreeMap<String, Metric> {
    let mut files = Vec::new();
    for dir in ["src", "layers/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    files.sort();
    let mut metrics: BTreeMap<String, Metric> = BTreeMap::new();
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        let shown = file
            .strip_prefix(root())
            .unwrap_or(file)
            .display()
            .to_string();
        for (word, kind) in Kind::ALL {
            let needle = format!("{word}!(");
            for (at, _) in text.match_indices(&needle) {
                let before = text[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue; // describe_counter!( and the like
                }
                let line_start = text[..at].rfind('\n').map_or(0, |n| n + 1);
                if text[line_start..at].trim_start().starts_with("//") {
                    continue; // a comment or a doc example
                }
                let line = text[..at].matches('\n').count() + 1;
                let site = format!("{shown}:{line}");
                let (literals, first_is_literal) = macro_arguments(&text, at + needle.len());
                let name = match literals.first() {
                    Some((name, false)) if first_is_literal => name.clone(),
                    _ => {
                        problems.push(format!(
                            "{site}: {word}! without a literal name: this test cannot see it"
                        ));
                        continue;
                    }
                };
                if !name.starts_with("acemq.") {
                    problems.push(format!("{site}: {name:?} is not named acemq.…"));
                    continue;
                }
                let labels = literals[1..]
                    .iter()
                    .filter(|(_, arrow)| *arrow)
                    .map(|(key, _)| key.clone());
                let metric = metrics.entry(name.clone()).or_insert_with(|| Metric {
                    kind,
                    labels: BTreeSet::new(),
                    sites: Vec::new(),
                });
                if metric.kind != kind {
                    problems.push(format!(
                        "{site}: {name} registered as a {word} here, as a {:?} at {:?}",
                        metric.kind, metric.sites
                    ));
                }
                metric.labels.extend(labels);
                metric.sites.push(site);
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    metrics
}

/// docs/metrics.md's table: name → (type, labels).
fn documented() -> BTreeMap<String, (Kind, BTreeSet<String>)> {
    let mut out = BTreeMap::new();
    for line in read("docs/metrics.md").lines() {
        if !line.starts_with("| `acemq.") {
            continue;
        }
        let cells: Vec<&str> = line.split(" | ").collect();
        assert!(cells.len() >= 4, "a table row with too few cells: {line}");
        let name = cells[0]
            .trim_start_matches("| ")
            .trim_matches('`')
            .to_owned();
        let kind = Kind::ALL
            .iter()
            .find(|(word, _)| cells[1].starts_with(word))
            .unwrap_or_else(|| {
                panic!(
                    "{name}: type {:?} is none of counter, gauge, histogram",
                    cells[1]
                )
            })
            .1;
        let labels = cells[2]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        assert!(
            out.insert(name.clone(), (kind, labels)).is_none(),
            "{name} is in docs/metrics.md's table twice"
        );
    }
    out
}

#[test]
fn docs_metrics_md_lists_every_registered_metric_with_its_type_and_labels_and_no_other() {
    let registered = registered();
    let documented = documented();
    // The scan itself works: the metrics every release has had are found.
    for name in [
        "acemq.deliveries",
        "acemq.handler.duration",
        "acemq.inflight",
    ] {
        assert!(
            registered.contains_key(name),
            "{name} not found in src/: {registered:#?}"
        );
    }
    let mut problems = Vec::new();
    for (name, metric) in &registered {
        match documented.get(name) {
            None => problems.push(format!(
                "{name} (registered at {}) is not in docs/metrics.md's table",
                metric.sites.join(", ")
            )),
            Some((kind, labels)) => {
                if *kind != metric.kind {
                    problems.push(format!(
                        "{name}: docs/metrics.md says {kind:?}, the source registers a {:?}",
                        metric.kind
                    ));
                }
                if *labels != metric.labels {
                    problems.push(format!(
                        "{name}: docs/metrics.md gives labels {labels:?}, the source {:?} ({})",
                        metric.labels,
                        metric.sites.join(", ")
                    ));
                }
            }
        }
    }
    for name in documented.keys() {
        if !registered.contains_key(name) {
            problems.push(format!(
                "{name} is in docs/metrics.md's table, and nothing in src/ or layers/src/ registers it"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every `acemq_…` word in `text` (after a character that cannot be part of
/// a Prometheus name, so `queue:acemq_deliveries:rate5m` counts too).
fn prometheus_names(text: &str, out: &mut BTreeSet<String>) {
    for (at, _) in text.match_indices("acemq_") {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let len = text[at..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(text.len() - at);
        out.insert(text[at..at + len].to_owned());
    }
}

fn json_strings<'a>(
    value: &'a Json,
    out: &mut Vec<(Option<&'a str>, &'a str)>,
    key: Option<&'a str>,
) {
    match value {
        Json::String(s) => out.push((key, s)),
        Json::Array(items) => items.iter().for_each(|v| json_strings(v, out, key)),
        Json::Object(map) => map.iter().for_each(|(k, v)| json_strings(v, out, Some(k))),
        _ => {}
    }
}

fn yaml_strings<'a>(
    value: &'a Yaml,
    out: &mut Vec<(Option<&'a str>, &'a str)>,
    key: Option<&'a str>,
) {
    match value {
        Yaml::String(s) => out.push((key, s)),
        Yaml::Sequence(items) => items.iter().for_each(|v| yaml_strings(v, out, key)),
        Yaml::Mapping(map) => {
            for (k, v) in map {
                yaml_strings(v, out, k.as_str());
            }
        }
        Yaml::Tagged(tagged) => yaml_strings(&tagged.value, out, key),
        _ => {}
    }
}

/// The metric a rendered Prometheus name comes from, if any.
fn maps_back<'a>(name: &str, by_rendered: &BTreeMap<String, (&'a str, Kind)>) -> Option<&'a str> {
    if let Some((metric, _)) = by_rendered.get(name) {
        return Some(metric);
    }
    let suffixes = [
        ("_total", Kind::Counter),
        ("_bucket", Kind::Histogram),
        ("_sum", Kind::Histogram),
        ("_count", Kind::Histogram),
    ];
    suffixes.iter().find_map(|(suffix, kind)| {
        let base = name.strip_suffix(suffix)?;
        by_rendered
            .get(base)
            .filter(|(_, k)| k == kind)
            .map(|(metric, _)| *metric)
    })
}

/// The series names metrics-exporter-prometheus (the shop's exporter)
/// renders for every registered metric: by default (summaries) and with
/// buckets set (histograms).
fn exporter_names(registered: &BTreeMap<String, Metric>) -> BTreeSet<String> {
    use metrics_exporter_prometheus::PrometheusBuilder;
    let builders = [
        PrometheusBuilder::new(),
        PrometheusBuilder::new()
            .set_buckets(&[0.1, 1.0])
            .expect("buckets"),
    ];
    let mut names = BTreeSet::new();
    for builder in builders {
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            for (name, metric) in registered {
                match metric.kind {
                    Kind::Counter => metrics::counter!(name.clone()).increment(1),
                    Kind::Gauge => metrics::gauge!(name.clone()).set(1.0),
                    Kind::Histogram => metrics::histogram!(name.clone()).record(0.5),
                }
            }
        });
        for line in handle.render().lines() {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

fn check_names(
    file: &str,
    strings: &[(Option<&str>, &str)],
    registered: &BTreeMap<String, Metric>,
) -> BTreeSet<String> {
    let by_rendered: BTreeMap<String, (&str, Kind)> = registered
        .iter()
        .map(|(name, m)| (name.replace('.', "_"), (name.as_str(), m.kind)))
        .collect();
    let rendered = exporter_names(registered);
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    let mut queries = 0;
    for (key, text) in strings {
        let mut names = BTreeSet::new();
        prometheus_names(text, &mut names);
        if *key == Some("expr") {
            queries += 1;
            if names.is_empty() {
                problems.push(format!("{file}: a query names no acemq metric: {text}"));
            }
        }
        for name in names {
            match maps_back(&name, &by_rendered) {
                None => problems.push(format!(
                    "{file}: {name} maps back to no metric acemq registers (docs/metrics.md)"
                )),
                Some(metric) => {
                    used.insert(metric.to_owned());
                }
            }
            if !rendered.contains(&name) {
                problems.push(format!(
                    "{file}: metrics-exporter-prometheus, as the shop builds it, renders no series named {name}"
                ));
            }
        }
    }
    assert!(queries > 0, "{file}: no `expr` found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    used
}

fn must_use(file: &str, used: &BTreeSet<String>, wanted: &[&str]) {
    let missing: Vec<_> = wanted.iter().filter(|m| !used.contains(**m)).collect();
    assert!(missing.is_empty(), "{file} does not show {missing:?}");
}

#[test]
fn the_prometheus_rules_name_only_metrics_acemq_registers() {
    let registered = registered();
    let file = "docs/prometheus/acemq.rules.yml";
    let rules: Yaml = serde_yaml_ng::from_str(&read(file)).expect("the rules file is YAML");
    let mut strings = Vec::new();
    yaml_strings(&rules, &mut strings, None);
    let used = check_names(file, &strings, &registered);
    must_use(
        file,
        &used,
        &[
            "acemq.retry.rung.missing",
            "acemq.dead_lettered",
            "acemq.consumer.recoveries",
            "acemq.drain.timeouts",
            "acemq.connection.blocked",
            "acemq.deliveries",
            "acemq.handler.duration",
        ],
    );
    // The unit tests load the rules from beside them.
    let tests: Yaml = serde_yaml_ng::from_str(&read("docs/prometheus/acemq.rules.test.yml"))
        .expect("the rules' tests are YAML");
    assert_eq!(tests["rule_files"][0].as_str(), Some("acemq.rules.yml"));
}

#[test]
fn the_grafana_dashboard_queries_only_metrics_acemq_registers() {
    let registered = registered();
    let file = "docs/grafana/acemq.json";
    let dashboard: Json = serde_json::from_str(&read(file)).expect("the dashboard is JSON");
    let mut strings = Vec::new();
    json_strings(&dashboard["panels"], &mut strings, None);
    json_strings(&dashboard["templating"], &mut strings, None);
    let used = check_names(file, &strings, &registered);
    must_use(
        file,
        &used,
        &[
            "acemq.deliveries",
            "acemq.handler.duration",
            "acemq.inflight",
            "acemq.held",
            "acemq.retry.scheduled",
            "acemq.dead_lettered",
            "acemq.consumer.recoveries",
            "acemq.drain.duration",
            "acemq.drain.timeouts",
            "acemq.connection.blocked",
            "acemq.settle.frames",
        ],
    );
}

/// The documents of a multi-document YAML file, by `kind`.
fn manifests(file: &str) -> BTreeMap<String, Yaml> {
    use serde::Deserialize;
    let text = read(file);
    let mut out = BTreeMap::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value = Yaml::deserialize(document).unwrap_or_else(|e| panic!("{file}: {e}"));
        if value.is_null() {
            continue; // the comment block before the first `---`
        }
        let kind = value["kind"]
            .as_str()
            .expect("every manifest has a kind")
            .to_owned();
        assert!(
            out.insert(kind.clone(), value).is_none(),
            "{file}: two {kind}s"
        );
    }
    out
}

fn get(router: &axum::Router, path: &str) -> StatusCode {
    use tower::ServiceExt;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let request = axum::http::Request::get(path)
        .body(axum::body::Body::empty())
        .expect("a request");
    runtime
        .block_on(router.clone().oneshot(request))
        .expect("the router is infallible")
        .status()
}

#[test]
fn the_kubernetes_manifests_agree_with_the_config_and_the_admin_router() {
    let file = "docs/k8s/deployment.yaml";
    let k8s = manifests(file);
    let config = acemq::Config::from_yaml_str(
        k8s["ConfigMap"]["data"]["shop.yaml"]
            .as_str()
            .expect("the shop's config"),
    )
    .expect("the ConfigMap's config loads");
    config.validate().expect("the ConfigMap's config is valid");
    assert_eq!(config.host_deadline_warning(), None);

    let deployment = &k8s["Deployment"];
    let pod = &deployment["spec"]["template"]["spec"];
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("a grace period");
    assert_eq!(
        Duration::from_secs(grace),
        config.host_timeout,
        "{file}: terminationGracePeriodSeconds is host_timeout, the same number"
    );
    // The drain's worst case: the deadline, the abandon grace, and at most
    // 4.25 s of closing (docs/deploying.md).
    let worst = config.shutdown_timeout + config.abandon_after + Duration::from_millis(4250);
    assert!(
        worst < config.host_timeout,
        "{worst:?} does not fit in {grace} s"
    );

    let container = &pod["containers"][0];
    assert!(
        container["lifecycle"]["preStop"].is_null(),
        "no preStop hook"
    );
    let args: Vec<&str> = container["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("a string"))
        .collect();
    let after = |flag: &str| {
        let i = args
            .iter()
            .position(|a| *a == flag)
            .unwrap_or_else(|| panic!("{flag} in {args:?}"));
        args[i + 1]
    };
    let mount = &container["volumeMounts"][0]["mountPath"];
    assert_eq!(
        after("--config"),
        format!("{}/shop.yaml", mount.as_str().expect("a mount path"))
    );
    let port = container["ports"][0]["containerPort"]
        .as_u64()
        .expect("a port");
    assert_eq!(after("--http"), format!("0.0.0.0:{port}"));
    let port_name = container["ports"][0]["name"].as_str().expect("a port name");

    // The admin token comes from a Secret, never from the manifest's text.
    let token = container["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"].as_str() == Some(acemq::admin::TOKEN_ENV))
        .unwrap_or_else(|| panic!("{file}: no {} in env", acemq::admin::TOKEN_ENV));
    assert!(
        token["value"].is_null(),
        "{file}: the token is not written in the manifest"
    );
    assert!(
        token["valueFrom"]["secretKeyRef"]["name"]
            .as_str()
            .is_some(),
        "{file}: the token comes from a Secret"
    );

    // The NetworkPolicy beside it selects the Deployment's pods and opens
    // only their admin port.
    let policy = &manifests("docs/k8s/networkpolicy.yaml")["NetworkPolicy"]["spec"];
    assert_eq!(
        policy["podSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(policy["policyTypes"][0].as_str(), Some("Ingress"));
    for rule in policy["ingress"].as_sequence().expect("ingress rules") {
        assert_eq!(rule["ports"][0]["port"].as_str(), Some(port_name));
        assert!(rule["ports"].as_sequence().expect("ports").len() == 1);
    }

    // Every probe asks the admin router for a route it serves: /healthz
    // answers 200 before anything connected, /readyz 503 (not ready yet).
    let router = acemq::admin::router(acemq::Health::new());
    for (probe, path, status) in [
        ("startupProbe", "/healthz", StatusCode::OK),
        ("livenessProbe", "/healthz", StatusCode::OK),
        ("readinessProbe", "/readyz", StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let http_get = &container[probe]["httpGet"];
        assert_eq!(http_get["path"].as_str(), Some(path), "{probe}");
        assert_eq!(http_get["port"].as_str(), Some(port_name), "{probe}");
        assert_eq!(get(&router, path), status, "{probe}: GET {path}");
    }

    let file = "docs/k8s/keda-scaledobject.yaml";
    let keda = manifests(file);
    let scaled = &keda["ScaledObject"]["spec"];
    assert_eq!(
        scaled["scaleTargetRef"]["name"],
        deployment["metadata"]["name"]
    );
    let trigger = &scaled["triggers"][0];
    assert_eq!(trigger["type"].as_str(), Some("rabbitmq"));
    assert_eq!(trigger["metadata"]["protocol"].as_str(), Some("amqp"));
    let queue = trigger["metadata"]["queueName"].as_str().expect("a queue");
    assert!(
        config.queue(queue).is_some(),
        "{file}: {queue} is not in the config"
    );
    let auth = &keda["TriggerAuthentication"];
    assert_eq!(
        trigger["authenticationRef"]["name"],
        auth["metadata"]["name"]
    );
    let secret = &container["env"][0]["valueFrom"]["secretKeyRef"];
    let target = &auth["spec"]["secretTargetRef"][0];
    assert_eq!(target["parameter"].as_str(), Some("host"));
    assert_eq!(
        (&target["name"], &target["key"]),
        (&secret["name"], &secret["key"])
    );
    // One drain ends before the next scale-down step starts one.
    let step = &scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        ["policies"][0];
    assert_eq!(step["value"].as_u64(), Some(1));
    assert!(step["periodSeconds"].as_u64().expect("a period") >= grace);
}
