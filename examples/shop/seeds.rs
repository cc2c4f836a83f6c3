//! The batches of orders the shop publishes at start (`--seed NAME`):
//! `demo` walks every path of the handler, `customers` shows per-key
//! ordering (`ordered_by: { json: /customer }`, or the header `x-customer`), `outage` the circuit
//! breaker (`circuit_breaker`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use acemq::Headers;

/// The customers of the `customers` batch, in the order each round of
/// their orders is published.
pub(crate) const CUSTOMERS: [&str; 4] = ["ada", "bob", "cyd", "dee"];
/// Orders per customer in the `customers` batch.
pub(crate) const ORDERS_PER_CUSTOMER: usize = 10;
/// How long each order of the `customers` batch works.
pub(crate) const CUSTOMER_WORK: Duration = Duration::from_millis(50);
/// Orders in the `outage` batch.
pub(crate) const OUTAGE_ORDERS: usize = 20;
/// How long the `outage` batch's downstream is down, from its publish.
pub(crate) const OUTAGE: Duration = Duration::from_secs(3);

/// Which batch to publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seed {
    /// One order per path: success, an in-process retry, a rung hop, a
    /// permanent rejection, a panic, an exhausted order, not an order.
    Demo,
    /// 40 orders of 4 customers (field `customer`, and header `x-customer`),
    /// interleaved: each customer's orders numbered in publish order
    /// (`ada-0` … `ada-9`).
    Customers,
    /// 20 orders whose every attempt fails until 3 s after the publish
    /// (`fail_until_ms`), then succeeds.
    Outage,
}

impl Seed {
    /// `demo`, `customers` or `outage`.
    pub(crate) fn parse(name: &str) -> Result<Seed, String> {
        match name {
            "demo" => Ok(Seed::Demo),
            "customers" => Ok(Seed::Customers),
            "outage" => Ok(Seed::Outage),
            other => Err(format!(
                "--seed {other:?}: the batches are demo, customers and outage"
            )),
        }
    }

    /// The batch's name, as its log line says it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Seed::Demo => "demo",
            Seed::Customers => "customers",
            Seed::Outage => "outage",
        }
    }

    /// The batch's orders, in publish order.
    pub(crate) fn orders(self) -> Vec<SeedOrder> {
        match self {
            Seed::Demo => demo(),
            Seed::Customers => customers(),
            Seed::Outage => outage(),
        }
    }
}

/// One order to publish: its message id, body and headers.
pub(crate) struct SeedOrder {
    pub(crate) id: String,
    pub(crate) body: Vec<u8>,
    pub(crate) headers: Headers,
}

impl SeedOrder {
    fn new(id: impl Into<String>, body: impl Into<Vec<u8>>) -> Self {
        SeedOrder {
            id: id.into(),
            body: body.into(),
            headers: Headers::new(),
        }
    }
}

fn demo() -> Vec<SeedOrder> {
    let mut out: Vec<SeedOrder> = (1..=4)
        .map(|i| {
            SeedOrder::new(
                format!("o-ok-{i}"),
                format!(r#"{{"id":"o-ok-{i}","work_ms":{}}}"#, i * 100),
            )
        })
        .collect();
    out.extend([
        SeedOrder::new("o-retry-here", r#"{"id":"o-retry-here","fail_attempts":1}"#),
        SeedOrder::new("o-rung-hop", r#"{"id":"o-rung-hop","fail_attempts":2}"#),
        SeedOrder::new("o-permanent", r#"{"id":"o-permanent","fail":"permanent"}"#),
        SeedOrder::new("o-panic", r#"{"id":"o-panic","fail":"panic"}"#),
        SeedOrder::new("o-exhausted", r#"{"id":"o-exhausted","fail_attempts":99}"#),
        SeedOrder::new("not-json", "this is not an order"),
    ]);
    out
}

fn customers() -> Vec<SeedOrder> {
    let work_ms = CUSTOMER_WORK.as_millis();
    let mut out = Vec::with_capacity(CUSTOMERS.len() * ORDERS_PER_CUSTOMER);
    for n in 0..ORDERS_PER_CUSTOMER {
        for customer in CUSTOMERS {
            let id = format!("{customer}-{n}");
            let mut order = SeedOrder::new(
                &id,
                format!(r#"{{"id":"{id}","customer":"{customer}","work_ms":{work_ms}}}"#),
            );
            order.headers.insert("x-customer", customer);
            out.push(order);
        }
    }
    out
}

fn outage() -> Vec<SeedOrder> {
    let until = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| (d + OUTAGE).as_millis());
    (0..OUTAGE_ORDERS)
        .map(|i| {
            let id = format!("out-{i}");
            SeedOrder::new(&id, format!(r#"{{"id":"{id}","fail_until_ms":{until}}}"#))
        })
        .collect()
}
