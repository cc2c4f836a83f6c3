//! Request/reply over direct reply-to: a server and a client in one program.
//!
//! ```text
//! cargo run --example rpc -- --serve            # terminal 1: answers on rpc.requests until SIGTERM/Ctrl-C
//! cargo run --example rpc -- --call 1000        # terminal 2: 1,000 calls, 8 at a time, prints each reply
//! ```
//!
//! The server upper-cases each request's body and replies before the
//! request is acknowledged (`App::serve`, an [`acemq::rpc::Responder`]); the client is
//! [`acemq::rpc::RpcClient`], a `tower::Service`, called through
//! `tower::ServiceExt` with a 5 s deadline per call. A call that fails
//! prints its typed error: a request the server dead-letters ends at once
//! as `the request was dead-lettered (rejected): …`
//! ([`acemq::rpc::RpcError::Rejected`], the reason as in the dead-letter
//! queue), not at its deadline. `AMQP_ADDR` names the broker (default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`); the queue `rpc.requests` is
//! declared by the server. `--log-format json` writes the log lines as
//! JSON.
//!
//! Exit codes: the server's are the drain's (0 clean); the client's are 0
//! when every call was answered, 1 when some were not, 64 bad usage, 69 no
//! broker.

#[path = "common/logging.rs"]
mod logging;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use acemq::config::QueueConfig;
use acemq::connection::amqp_addr_from_env;
use acemq::layers::escape;
use acemq::rpc::{RpcClient, RpcRequest};
use acemq::{App, BoxError, Config, Delivery};
use futures::StreamExt;
use tower::{service_fn, Service, ServiceExt};

const QUEUE: &str = "rpc.requests";
const USAGE: &str = "usage: rpc --serve | --call N [--log-format text|json]";

enum Mode {
    Serve,
    Call(usize),
}

fn parse(args: &[String]) -> Result<Mode, String> {
    match args {
        [flag] if flag == "--serve" => Ok(Mode::Serve),
        [flag, n] if flag == "--call" => n
            .parse()
            .map(Mode::Call)
            .map_err(|_| format!("--call {n:?} is not a whole number")),
        _ => Err(USAGE.to_owned()),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (format, args) = match logging::take_log_format(args) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(64);
        }
    };
    logging::init(format, acemq::log::DEFAULT_FILTER, std::io::stderr);
    match parse(&args) {
        Ok(Mode::Serve) => serve().await,
        Ok(Mode::Call(n)) => call(n).await,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(64)
        }
    }
}

async fn serve() -> ExitCode {
    let mut queue = QueueConfig::new(QUEUE);
    queue.concurrency = 8;
    queue.prefetch = 16;
    let app = App::new(Config::new([queue]));
    let upper =
        service_fn(|d: Delivery| async move { Ok::<_, BoxError>(d.body().to_ascii_uppercase()) });
    // `serve`: a `Responder` around the handler, and the queue marked as
    // serving requests (a dead-lettered request gets an error reply).
    app.serve(QUEUE, upper).run().await
}

async fn call(n: usize) -> ExitCode {
    let addr = amqp_addr_from_env();
    let conn = match lapin::Connection::connect(&addr, lapin::ConnectionProperties::default()).await
    {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!(
                "rpc: no broker at {}: {e}",
                acemq::connection::redact(&addr)
            );
            return ExitCode::from(acemq::app::EXIT_UNAVAILABLE);
        }
    };
    let client = RpcClient::new(conn);
    let failed: usize = futures::stream::iter(0..n)
        .map(|i| {
            let mut client = client.clone();
            async move {
                let request = RpcRequest::new(
                    "",
                    QUEUE,
                    format!("hello {i}").into_bytes(),
                    Duration::from_secs(5),
                );
                match async { client.ready().await?.call(request).await }.await {
                    Ok(reply) => {
                        // The server's words: shown escaped.
                        let body = String::from_utf8_lossy(reply.body());
                        println!("{i}: {}", escape(&body));
                        0
                    }
                    Err(e) => {
                        eprintln!("{i}: {}", escape(&e.to_string()));
                        1
                    }
                }
            }
        })
        .buffer_unordered(8)
        .fold(0, |acc, f| async move { acc + f })
        .await;
    println!("{} replies, {failed} calls unanswered", n - failed);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
