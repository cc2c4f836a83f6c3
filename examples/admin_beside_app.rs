//! The admin routes served beside an `App`, exactly as the module docs of
//! `acemq::admin` and the README show them: `acemq::admin::serve` until
//! `health.drained()`, and `main` returns `run`'s exit code. With no broker
//! at `AMQP_ADDR` the start fails, `drained` resolves, the server stops and
//! the process exits 69 at once.
//!
//! ```text
//! export ACEMQ_ADMIN_TOKEN=$(openssl rand -hex 32)
//! cargo run --example admin_beside_app
//! curl -X POST -H "Authorization: Bearer $ACEMQ_ADMIN_TOKEN" localhost:8080/queues/shop.orders/pause
//! ```
//!
//! `ADMIN_ADDR` moves the admin address (default `127.0.0.1:8080`).

use acemq::admin::{AdminRouter, AdminToken};
use acemq::{App, Config, Delivery};
use tower::service_fn;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = Config::from_path("examples/shop.yaml").expect("valid config");
    let app = App::new(config).consume(
        "shop.orders",
        service_fn(|_d: Delivery| async { Ok::<_, acemq::BoxError>(()) }),
    );
    let health = app.health();
    // ACEMQ_ADMIN_TOKEN: pause and resume need it; unset, they answer 403.
    let token = AdminToken::from_env().expect("ACEMQ_ADMIN_TOKEN");
    let admin = AdminRouter::new(health.clone()).token_opt(token).build();
    let addr = std::env::var("ADMIN_ADDR").unwrap_or_else(|_| "127.0.0.1:8080".to_owned());
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let server = tokio::spawn(acemq::admin::serve(listener, admin, health.drained()));
    let code = app.run().await;
    let _ = server.await;
    code
}
