//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) and the
//! regression inputs (`fuzz/regressions/<target>/`) through the same
//! property functions as the fuzz targets (`fuzz/props/*.rs`), on stable,
//! without libFuzzer. See fuzz/README.md.

use std::path::{Path, PathBuf};

#[allow(dead_code)]
#[path = "../fuzz/props/addresses.rs"]
mod addresses;
#[allow(dead_code)]
#[path = "../fuzz/props/config.rs"]
mod config;
#[allow(dead_code)]
#[path = "../fuzz/props/duration.rs"]
mod duration;
#[allow(dead_code)]
#[path = "../fuzz/props/frame.rs"]
mod frame;
#[allow(dead_code)]
#[path = "../fuzz/props/headers.rs"]
mod headers;
#[allow(dead_code)]
#[path = "../fuzz/props/ledger.rs"]
mod ledger;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files of `dir`, sorted; `required` fails on a missing or empty
/// directory, so a broken path is not silently green.
fn files(dir: &Path, required: bool) -> Vec<PathBuf> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => panic!("cannot read {}: {e}", dir.display()),
    };
    let mut out: Vec<PathBuf> = entries
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    assert!(
        !required || !out.is_empty(),
        "{} holds no corpus file",
        dir.display()
    );
    out
}

/// Runs `check` on every file of the target's corpus and regressions,
/// naming the file that fails.
fn replay(target: &str, check: fn(&[u8])) {
    let dir = fuzz_dir();
    let corpus = files(&dir.join("corpus").join(target), true);
    let regressions = files(&dir.join("regressions").join(target), false);
    for path in corpus.iter().chain(&regressions) {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let outcome = std::panic::catch_unwind(|| check(&data));
        if let Err(panic) = outcome {
            eprintln!("fuzz input {} failed", path.display());
            std::panic::resume_unwind(panic);
        }
    }
}

#[test]
fn the_headers_corpus_replays_without_a_failure() {
    replay("headers", headers::check);
}

#[test]
fn the_config_corpus_replays_without_a_failure() {
    replay("config", config::check);
}

#[test]
fn the_addresses_corpus_replays_without_a_failure() {
    replay("addresses", addresses::check);
}

#[test]
fn the_duration_corpus_replays_without_a_failure() {
    replay("duration", duration::check);
}

#[test]
fn the_frame_corpus_replays_without_a_failure() {
    // On the stack lapin's IO loop gets by default (2 MiB, whatever
    // RUST_MIN_STACK says): the parse must fit in it at any nesting.
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| replay("frame", frame::check))
        .expect("a replay thread")
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
}

#[test]
fn the_frame_seeds_hold_what_their_names_say() {
    use amq_protocol::frame::{parse_frame, AMQPFrame};
    use amq_protocol::types::SkipReason;
    let properties = |seed: &str| {
        let data = std::fs::read(fuzz_dir().join("corpus/frame").join(seed)).unwrap();
        match parse_frame(&data[..]) {
            Ok((_, AMQPFrame::Header(_, header))) => header.properties,
            other => panic!("{seed}: not a content header frame: {other:?}"),
        }
    };
    let skipped = |seed: &str| properties(seed).headers_skipped().map(|s| s.reason());
    assert!(properties("seed-headers-64-deep").headers().is_some());
    assert_eq!(skipped("seed-headers-64-deep"), None);
    for seed in [
        "seed-headers-65-deep",
        "seed-headers-1000-deep",
        "seed-arrays-1000-deep",
    ] {
        assert_eq!(skipped(seed), Some(SkipReason::NestingTooDeep), "{seed}");
    }
    let deep = properties("seed-headers-1000-deep");
    assert_eq!(deep.content_type(), &Some("text/plain".into()));
    assert_eq!(deep.delivery_mode(), &Some(2));
    assert_eq!(
        skipped("seed-header-name-not-utf8"),
        Some(SkipReason::Malformed)
    );
}

#[test]
fn the_ledger_corpus_replays_without_a_failure() {
    replay("ledger", ledger::check);
}

#[test]
fn the_ledger_property_holds_on_pseudo_random_event_sequences() {
    // Beyond the corpus: 3,000 sequences from a fixed seed, every bound
    // (count 0-15, window 0-63) and up to 600 events each.
    let mut rng = fastrand::Rng::with_seed(0x1ed6e5);
    for _ in 0..3000 {
        let len = rng.usize(2..1200);
        let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        let outcome = std::panic::catch_unwind(|| ledger::check(&data));
        if let Err(panic) = outcome {
            eprintln!("ledger input that failed: {data:?}");
            std::panic::resume_unwind(panic);
        }
    }
}

#[test]
fn a_missing_or_empty_corpus_directory_fails_the_replay() {
    let missing = fuzz_dir().join("corpus").join("no-such-target");
    assert!(std::panic::catch_unwind(|| files(&missing, true)).is_err());
    let empty = std::env::temp_dir().join(format!("acemq-empty-corpus-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let outcome = std::panic::catch_unwind(|| files(&empty, true));
    std::fs::remove_dir(&empty).unwrap();
    assert!(outcome.is_err());
}

// ---------------------------------------------------------------------------
// Findings: each input the fuzzer or the properties found, spelled out, with
// what must hold of it (fuzz/README.md lists them).
// ---------------------------------------------------------------------------

/// The panic message of `f`, if it panics.
fn panic_of(f: impl FnOnce() + std::panic::UnwindSafe) -> Option<String> {
    let payload = std::panic::catch_unwind(f).err()?;
    Some(
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    )
}

#[test]
fn a_header_name_longer_than_255_bytes_does_not_panic_table_from_headers() {
    // A handler's or producer's header (Publisher::publish_with_headers, a
    // rung or dead-letter copy of it) goes through this conversion; a name
    // over an AMQP short string's 255 bytes should be an error, not a panic.
    let mut headers = acemq::Headers::new();
    headers.insert("x".repeat(256), "v");
    let panic = panic_of(|| {
        let _ = acemq::convert::table_from_headers(&headers);
    });
    assert_eq!(panic, None);
    let refused = acemq::convert::try_table_from_headers(&headers).unwrap_err();
    assert!(refused.to_string().contains("256 bytes long"), "{refused}");
}

#[test]
fn a_property_longer_than_255_bytes_does_not_panic_properties_to_lapin() {
    // Publisher::publish_with_headers converts the caller's properties the
    // same way: a content type (or message id, correlation id, …) over 255
    // bytes should be an error, not a panic.
    let mut properties = acemq::Properties::default();
    properties.content_type = Some("x".repeat(256));
    let panic = panic_of(|| {
        let _ = acemq::convert::properties_to_lapin(&properties, &acemq::Headers::new());
    });
    assert_eq!(panic, None);
    let refused =
        acemq::convert::try_properties_to_lapin(&properties, &acemq::Headers::new()).unwrap_err();
    assert!(refused.to_string().contains("content_type"), "{refused}");
}

#[test]
fn a_queue_argument_name_longer_than_255_bytes_does_not_panic_the_topology() {
    // validate() accepts the config; building its declarations panics.
    // validate() should refuse an argument name over 255 bytes, naming it.
    let yaml = format!(
        "queues:\n  - name: q\n    arguments: {{ {}: 1 }}\n",
        "x".repeat(256)
    );
    match acemq::Config::from_yaml_str(&yaml) {
        // Refused with a config error naming the field: the fix.
        Err(e) => assert_eq!(e.field(), Some("queues[0].arguments"), "{e}"),
        Ok(config) => {
            let panic = panic_of(|| {
                let _ = acemq::topology::Topology::from_config(&config);
            });
            assert_eq!(panic, None);
        }
    }
}

#[test]
fn a_config_with_four_billion_attempts_is_validated_at_once() {
    // The delays (1 s) stay below the default threshold (30 s), so the walk
    // allocates nothing and only takes its time; with `max_delay: 30` every
    // delay from the sixth attempt on is a broker wait and rung_delays
    // collects ~4.3e9 equal Durations before it dedups them. Run on a thread
    // and given a second, so the test itself does not hang (the thread is
    // abandoned when the test fails).
    let yaml = "queues:\n  - name: q\n    retries: { max_attempts: 4294967295, \
                initial_delay: 1, max_delay: 1 }\n";
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let outcome = acemq::Config::from_yaml_str(yaml).map(|_| ());
        let _ = done.send(outcome.map_err(|e| e.to_string()));
    });
    let outcome = finished.recv_timeout(std::time::Duration::from_secs(1));
    let outcome = outcome.expect("validating max_attempts: 4294967295 took more than a second");
    let message = outcome.expect_err("max_attempts: 4294967295 is above the maximum");
    assert!(
        message.contains("max_attempts") && message.contains("1000000"),
        "{message}"
    );
}

#[test]
fn a_comma_in_the_user_name_does_not_show_the_password_in_a_redacted_address() {
    // resolve_addresses splits an address at a comma, so one with a comma
    // in its user name is refused (write it %2C), and redacted as one
    // address. Found by the `addresses` target as
    // `http:@\x18\0,guest:gumqt@\n7` (once redacted to
    // `<unparseable AMQP address>,guest:gumqt@7`).
    let addr = "amqp://ops,team:s3cret@broker:5672/%2f";
    let refused = acemq::connection::check_address(addr).unwrap_err();
    assert!(
        refused.contains("%2C") && !refused.contains("s3cret"),
        "{refused}"
    );
    let shown = acemq::connection::redact(addr);
    assert!(!shown.contains("s3cret"), "{shown}");
    let fuzzed = "http:@\u{18}\0,guest:gumqt@\n7";
    let shown = acemq::connection::redact(fuzzed);
    assert!(!shown.contains("gumqt"), "{shown}");
}

#[test]
fn a_queue_named_like_another_queues_dead_letter_queue_is_refused_by_validate() {
    // Found by the `config` property (no queue declared twice differently)
    // on a hand-written probe, not by the fuzzer in its 15 minutes. The same
    // holds for a queue named like another's rung (`a.retry.2s`).
    let yaml =
        "queues:\n  - { name: a, dead_letter: true }\n  - { name: a.dlq, dead_letter: true }\n";
    let refused = acemq::Config::from_yaml_str(yaml).expect_err(
        "validate() should refuse a queue named like another queue's dead-letter queue",
    );
    assert_eq!(refused.field(), Some("queues[1].name"), "{refused}");
    assert!(
        refused.to_string().contains("queues[0] (\"a\")"),
        "{refused}"
    );
    let rung = "queues:\n  - { name: a, retries: { max_attempts: 2, initial_delay: 2, \
                max_delay: 2, broker_wait_threshold: 1 } }\n  - name: a.retry.2s\n";
    let refused = acemq::Config::from_yaml_str(rung).expect_err("a rung's name");
    assert_eq!(refused.field(), Some("queues[1].name"), "{refused}");
}
