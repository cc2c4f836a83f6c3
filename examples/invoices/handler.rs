//! The invoices handler: a plain `tower::Service`, shared by the example and
//! its in-memory tests.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::time::Duration;

use acemq::{queue_layers, BoxError, Delivery, Outcome, Publisher, QueueStack, Reject};
use tower::timeout::TimeoutLayer;
use tower::util::MapResponseLayer;

/// The example's config: a topic exchange, the consumed queue bound to it,
/// and the receipts queue declared only.
pub(crate) const CONFIG: &str = "
shutdown_timeout: 10
exchanges:
  - { name: billing, type: topic }
queues:
  - name: billing.invoices
    prefetch: 20
    concurrency: 4
    dead_letter: true
    bindings: [{ exchange: billing, routing_keys: ['invoices.*'] }]
    retries: { max_attempts: 3, initial_delay: 1, max_delay: 4, broker_wait_threshold: 2 }
  - name: billing.receipts
    consume: false
";

fn audit(outcome: Outcome) -> Outcome {
    tracing::info!(outcome = outcome.decision().outcome(), "audit");
    outcome
}

/// The layers of the example, outside and inside the acemq stack, named in
/// the order [`stack`] adds them.
pub(crate) type Layers = QueueStack<
    queue_layers![MapResponseLayer<fn(Outcome) -> Outcome>],
    queue_layers![TimeoutLayer],
>;

/// Outer: an audit of every final outcome (each invoice once). Inner: each
/// attempt gets 2 s; a timeout is retried, then dead-lettered as `timeout`.
pub(crate) fn stack() -> Layers {
    QueueStack::new()
        .outer(MapResponseLayer::new(audit as fn(Outcome) -> Outcome))
        .inner(TimeoutLayer::new(Duration::from_secs(2)))
}

/// Validates an invoice and publishes its receipt to `billing.receipts`.
#[derive(Clone, Debug)]
pub(crate) struct Invoices {
    publisher: Option<Publisher>,
}

impl Invoices {
    /// Publishing receipts through `publisher`.
    #[allow(dead_code)] // the example's; the tests use `without_receipts`
    pub(crate) fn new(publisher: Publisher) -> Self {
        Invoices {
            publisher: Some(publisher),
        }
    }

    /// Without receipts (the in-memory tests: the stack's own publishes are
    /// recorded by the harness; a follow-up publish needs a broker).
    #[allow(dead_code)] // the tests'
    pub(crate) fn without_receipts() -> Self {
        Invoices { publisher: None }
    }
}

#[derive(serde::Deserialize)]
struct Invoice {
    id: String,
    amount: i64,
}

impl tower::Service<Delivery> for Invoices {
    type Response = ();
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, d: Delivery) -> Self::Future {
        let publisher = self.publisher.clone();
        Box::pin(async move {
            let invoice: Invoice = serde_json::from_slice(d.body())
                .map_err(|e| Reject::new(format!("not an invoice: {e}")))?;
            if invoice.amount <= 0 {
                return Err(Reject::new(format!(
                    "invoice {} has amount {}: nothing to bill",
                    invoice.id, invoice.amount
                ))
                .into());
            }
            if d.original_routing_key() == "invoices.slow" {
                // Slower than the per-attempt timeout.
                tokio::time::sleep(std::time::Duration::from_secs(10)).await;
            }
            if let Some(p) = publisher {
                let receipt = serde_json::json!({ "invoice": invoice.id, "region": d.original_routing_key() });
                p.publish_json("", "billing.receipts", &receipt).await?;
            }
            Ok(())
        })
    }
}
