//! `rudra-node`: run a Rudra cluster. See `rudra-node --help`.
//!
//! # Layout
//! - `cli`: the command line (clap's types).
//! - `commands`: one module per command, and the node roles.
//! - `stop`: how a node stops on SIGTERM and SIGINT, and on a panic in any thread.

mod cli;
mod commands;
mod stop;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use cli::{Cli, LogFormat};
use rudra_runtime::RuntimeError;

/// mimalloc keeps freed pages for the next allocation of their size: a node allocates and
/// frees a frame-sized buffer for every payload it sends and receives, which the system
/// allocator returns to the kernel and faults in again each time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What is logged when `RUST_LOG` is unset: `info`, but only warnings from the HTTP server's
/// workers (their start and stop).
const DEFAULT_LOG: &str = "info,actix_server=warn";

/// Log to stderr at `RUST_LOG` (default `info`) as text (coloured on a terminal) or JSON lines.
fn init_tracing(format: LogFormat) {
    let (filter, refused) = match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => (filter, None),
        Err(_) if std::env::var_os("RUST_LOG").is_none() => {
            (tracing_subscriber::EnvFilter::new(DEFAULT_LOG), None)
        }
        Err(e) => {
            (tracing_subscriber::EnvFilter::new(DEFAULT_LOG), std::env::var("RUST_LOG").ok().map(|v| (v, e)))
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    if let Some((value, e)) = refused {
        tracing::warn!("RUST_LOG={value:?} is not a valid filter ({e}); logging at info");
    }
}

fn main() -> ExitCode {
    if std::env::var_os("NODEVICE_SELECT").is_none() {
        // Mesa's Vulkan device-selection layer connects to a Wayland or X display when wgpu
        // opens, printing an error line on headless nodes; the adapter is chosen here anyway.
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    }
    let matches = Cli::command().get_matches();
    // A role from the environment (a container's RUDRA_ROLE) does not stop a subcommand run
    // in the same container, such as `cert token`.
    let role_from_env = matches.value_source("role") == Some(clap::parser::ValueSource::EnvVariable);
    let mut cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if cli.command.is_some() && role_from_env {
        cli.role = None;
    }
    init_tracing(cli.log_format);
    stop::stop_on_signals();
    stop::stop_on_panic();
    let result = match (cli.command.take(), cli.role) {
        (Some(command), None) => commands::run(command),
        (None, Some(role)) => commands::run_node(role, &cli),
        (Some(_), Some(_)) => {
            Err(RuntimeError::Config("--role runs a node; give it without a subcommand".into()))
        }
        (None, None) => Err(RuntimeError::Config("give a subcommand (see --help) or --role".into())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code() as u8)
        }
    }
}
