//! `acemq`, the operator command for acemq: plan and apply the topology a
//! config names, show queue depths, peek at and replay dead letters, publish
//! a message, show streams' stored offsets, write the config's AsyncAPI
//! document. See the crate's README for each verb and its exit codes.

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;

mod asyncapi;
mod cli;
mod connect;
mod exit;
mod offsets;
mod output;
mod peek;
mod probe;
mod publish;
mod queues;
mod replay;
mod topology;

use cli::{Cli, Command, DlqCommand, StreamCommand, TopologyCommand};
use exit::{Exit, Failure};

async fn run(cli: Cli) -> Result<Exit, Failure> {
    let addr = cli.amqp_addr.as_deref();
    let json = cli.json;
    match &cli.command {
        Command::Topology(TopologyCommand::Plan(a)) => topology::plan(&a.config, addr, json).await,
        Command::Topology(TopologyCommand::Apply(a)) => {
            topology::apply(&a.config, addr, json).await
        }
        Command::Queues(a) => queues::queues(&a.config.config, a.strict, addr, json).await,
        Command::Dlq(DlqCommand::Peek(a)) => peek::peek(a, addr, json).await,
        Command::Dlq(DlqCommand::Replay(a)) => replay::replay(a, addr, json).await,
        Command::Publish(a) => publish::publish(a, addr, json).await,
        Command::Stream(StreamCommand::Offsets(a)) => offsets::offsets(&a.config, addr, json).await,
        Command::Asyncapi(a) => asyncapi::asyncapi(a, json),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version are answers (0, on stdout); every other clap
            // error is a usage error: 64, not clap's 2, on stderr, with any
            // address it echoes shown without its password.
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = e.print();
                    Exit::Ok.into()
                }
                _ => {
                    eprint!("{}", output::scrub_passwords(&e.render().to_string()));
                    Exit::Usage.into()
                }
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("acemq: could not start the runtime: {e}");
            return ExitCode::from(70); // EX_SOFTWARE
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(exit) => exit.into(),
        Err(failure) => {
            eprintln!("acemq: {}", output::scrub_passwords(&failure.message));
            failure.exit.into()
        }
    }
}
