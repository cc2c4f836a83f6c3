//! Fakes shared by the layer tests: a recording `Publish` and a metrics
//! recorder. Each test binary uses its own part of them.
#![allow(dead_code, unreachable_pub)]

use std::collections::{HashMap, HashSet};
use std::future::{ready, Future};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use acemq_layers::{ErrorReply, Headers, Outgoing, Properties, Publish, PublishError};
use bytes::Bytes;

/// A publish the fake accepted.
#[derive(Debug, Clone)]
pub struct Published {
    pub queue: String,
    pub headers: Headers,
    pub body: Bytes,
    pub properties: Properties,
}

#[derive(Default)]
pub struct BrokerState {
    pub published: Vec<Published>,
    pub attempted: Vec<String>,
    pub redeclared: Vec<String>,
    /// Unroutable for good.
    pub unroutable: HashSet<String>,
    /// Unroutable until `redeclare` is called for it.
    pub missing: HashSet<String>,
    pub nacking: HashSet<String>,
    /// Error replies sent: (reply_to, correlation_id, reason, error).
    pub replies: Vec<(String, String, String, String)>,
}

/// Records every publish; queues can be unroutable, missing until
/// redeclared, or nacking.
#[derive(Clone, Default)]
pub struct FakePublisher(Arc<Mutex<BrokerState>>);

impl FakePublisher {
    pub fn with(self, f: impl FnOnce(&mut BrokerState)) -> Self {
        f(&mut self.0.lock().unwrap());
        self
    }
    pub fn unroutable(self, queue: &str) -> Self {
        self.with(|s| {
            s.unroutable.insert(queue.to_owned());
        })
    }
    pub fn nacking(self, queue: &str) -> Self {
        self.with(|s| {
            s.nacking.insert(queue.to_owned());
        })
    }
    pub fn published(&self) -> Vec<Published> {
        self.0.lock().unwrap().published.clone()
    }
    pub fn attempted(&self) -> Vec<String> {
        self.0.lock().unwrap().attempted.clone()
    }
    pub fn redeclared(&self) -> Vec<String> {
        self.0.lock().unwrap().redeclared.clone()
    }
    pub fn replies(&self) -> Vec<(String, String, String, String)> {
        self.0.lock().unwrap().replies.clone()
    }
}

impl Publish for FakePublisher {
    fn publish(
        &self,
        message: Outgoing<'_>,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        let mut s = self.0.lock().unwrap();
        let queue = message.queue.to_owned();
        s.attempted.push(queue.clone());
        let result = if s.unroutable.contains(&queue) || s.missing.contains(&queue) {
            Err(PublishError::Unroutable { queue })
        } else if s.nacking.contains(&queue) {
            Err(PublishError::Nacked { queue })
        } else {
            s.published.push(Published {
                queue,
                headers: message.headers,
                body: message.delivery.body().clone(),
                properties: message.delivery.properties().clone(),
            });
            Ok(())
        };
        ready(result)
    }

    fn redeclare(&self, queue: &str) -> impl Future<Output = Result<(), PublishError>> + Send {
        let mut s = self.0.lock().unwrap();
        s.redeclared.push(queue.to_owned());
        s.missing.remove(queue);
        ready(Ok(()))
    }

    fn reply_error(
        &self,
        reply: ErrorReply<'_>,
    ) -> impl Future<Output = Result<(), PublishError>> + Send {
        let mut s = self.0.lock().unwrap();
        // In `attempted` too, so a test sees its place among the publishes.
        s.attempted.push(format!("reply:{}", reply.reply_to));
        s.replies.push((
            reply.reply_to.to_owned(),
            reply.correlation_id.to_owned(),
            reply.decision.reason.as_str().to_owned(),
            reply.decision.error.clone(),
        ));
        ready(Ok(()))
    }
}

/// A metrics recorder that keeps counters as `name{k=v,..}` → value.
#[derive(Default)]
pub struct Counters(Mutex<HashMap<String, Arc<AtomicU64>>>);

impl Counters {
    pub fn get(&self, key: &str) -> u64 {
        self.0
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }
}

impl metrics::Recorder for Counters {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let counter = self.0.lock().unwrap().entry(name).or_default().clone();
        metrics::Counter::from_arc(counter)
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}
