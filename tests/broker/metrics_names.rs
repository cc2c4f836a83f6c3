//! docs/metrics.md promises the names the Prometheus exporter renders for
//! acemq's metrics; this checks the exporter (the one the shop uses) renders
//! them so.

use metrics_exporter_prometheus::PrometheusBuilder;

#[test]
fn the_prometheus_exporter_renders_acemq_metric_names_as_docs_metrics_md_says() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("acemq.retry.rung.missing", "queue" => "q").increment(1);
        metrics::counter!("acemq.deliveries", "queue" => "q", "outcome" => "ack").increment(1);
        metrics::gauge!("acemq.inflight", "queue" => "q").set(1.0);
        metrics::histogram!("acemq.handler.duration", "queue" => "q").record(0.1);
    });
    let text = handle.render();
    println!("{text}");
    let docs = include_str!("../../docs/metrics.md");
    for line in [
        "acemq_retry_rung_missing{queue=\"q\"} 1",
        "acemq_deliveries{queue=\"q\",outcome=\"ack\"} 1",
        "acemq_inflight{queue=\"q\"} 1",
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }
    assert!(text.contains("acemq_handler_duration"), "{text}");
    assert!(
        docs.contains("acemq_retry_rung_missing"),
        "the alert in docs/metrics.md uses the rendered name"
    );
}
