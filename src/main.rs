//! The `sidecache` binary: command line, tracing, and running the app until
//! a shutdown signal. Everything else lives in the library.

use clap::{Parser, Subcommand};
use sidecache::config::FileLogFormat;
use sidecache::config::{Config, QueryMode, RuntimeLayout, ServerConfig};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: see bench/README.md ("Memory per
/// idle connection") for what it changes.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (index 15 in both its v2 and v3
/// headers; the Rust bindings name only some options).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Exit code for an invalid config (and for usage errors, as clap does).
const EXIT_CONFIG: u8 = 2;

#[derive(Parser)]
#[command(
    name = "sidecache",
    version,
    about = "A transparent caching sidecar reverse proxy"
)]
struct Cli {
    /// Path of the YAML config.
    #[arg(long, global = true, env = "SIDECACHE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

/// The subcommands: the one that needs no config, and the others.
#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Configured(Configured),
    /// Print the SQL that installs the outbox table and its NOTIFY trigger.
    OutboxDdl {
        /// Table name (`name` or `schema.name`).
        #[arg(long, default_value = sidecache::invalidation::ddl::DEFAULT_TABLE)]
        table: String,
        /// Channel the trigger notifies (`invalidation.outbox.notify_channel`).
        #[arg(long, default_value = sidecache::invalidation::ddl::DEFAULT_CHANNEL)]
        channel: String,
        /// No NOTIFY trigger (`invalidation.outbox.notify: false`): drops it.
        #[arg(long)]
        no_notify: bool,
    },
    /// Print the JSON Schema of the config file (for editors:
    /// `# yaml-language-server: $schema=sidecache.schema.json`).
    Schema,
}

/// The subcommands that read the config.
#[derive(Subcommand)]
enum Configured {
    /// Serve (the default).
    Run,
    /// Validate the config, print the route table, exit 0; invalid: exit 2.
    Check {
        /// Also check the database change capture reads (tables, columns,
        /// triggers or publication); a mismatch exits 2, an unreachable
        /// database 1.
        #[arg(long)]
        db: bool,
    },
    /// Print the SQL that `invalidation.capture` needs: the outbox and the
    /// capture triggers (`mode: triggers`), or the publication and replica
    /// identities (`mode: logical`).
    CaptureDdl {
        /// Print the SQL that removes the capture triggers instead.
        #[arg(long)]
        drop: bool,
    },
    /// Ask the running instance (admin.listen in the config) what the cache
    /// holds for URL and what a GET would get now; prints a table.
    Lookup {
        /// The path and query to explain, like /api/tenants/acme/apps/1.
        url: String,
        /// A request header of the explained request (`Name: value`), for
        /// `vary` and bypass; repeatable.
        #[arg(long = "header", short = 'H')]
        headers: Vec<String>,
        /// Print the JSON answer instead of the table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    // Freed pages go back to the OS at once, not after mimalloc's delay
    // (1 s, and only when the allocator runs again): after a burst of
    // connections that then park, what their hyper buffers held would stay
    // resident (bench/README.md, idle connections). An operator's
    // MIMALLOC_PURGE_DELAY wins.
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a process-wide allocator option; no other thread
        // runs yet.
        #[allow(unsafe_code)]
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0)
        };
    }
    let cli = Cli::parse();
    let command = match cli.command {
        None => Configured::Run,
        Some(Command::Configured(command)) => command,
        // Needs no config: prints SQL for the operator to install.
        Some(Command::OutboxDdl {
            table,
            channel,
            no_notify,
        }) => return print_outbox_ddl(&table, (!no_notify).then_some(channel.as_str())),
        Some(Command::Schema) => return print_out(&(sidecache::config::json_schema() + "\n")),
    };
    let Some(path) = cli.config else {
        eprintln!("sidecache: --config PATH (or SIDECACHE_CONFIG) is required");
        return ExitCode::from(EXIT_CONFIG);
    };
    let cfg = match Config::load(&path) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("sidecache: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match command {
        Configured::Check { db } => {
            for w in &cfg.warnings {
                eprintln!("sidecache: warning: {w}");
            }
            print_routes(&path, &cfg);
            match db {
                true => check_db(&cfg),
                false => ExitCode::SUCCESS,
            }
        }
        Configured::CaptureDdl { drop } => print_capture_ddl(&cfg, drop),
        Configured::Run => run(path, cfg),
        Configured::Lookup { url, headers, json } => lookup(&cfg, &url, &headers, json),
    }
}

/// Writes `text` to stdout; a reader that went away (`| head`) is not an
/// error of ours.
fn print_out(text: &str) -> ExitCode {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("sidecache: cannot write to stdout: {e}");
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    }
}

fn print_outbox_ddl(table: &str, channel: Option<&str>) -> ExitCode {
    match sidecache::invalidation::ddl::outbox_ddl(table, channel) {
        Ok(sql) => print_out(&sql),
        Err(e) => {
            eprintln!("sidecache outbox-ddl: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

fn print_capture_ddl(cfg: &Config, drop: bool) -> ExitCode {
    use sidecache::config::CaptureMode;
    use sidecache::invalidation::capture::ddl;
    let Some(capture) = &cfg.invalidation.capture else {
        eprintln!("sidecache capture-ddl: the config has no invalidation.capture");
        return ExitCode::from(EXIT_CONFIG);
    };
    let sql = match (capture.mode, drop, &cfg.invalidation.outbox) {
        (CaptureMode::Triggers, true, _) => Ok(ddl::drop(capture)),
        (CaptureMode::Triggers, false, Some(outbox)) => ddl::install(capture, outbox),
        (CaptureMode::Triggers, false, None) => Err("mode: triggers without an outbox".to_owned()),
        (CaptureMode::Logical, false, _) => Ok(ddl::publication(capture)),
        (CaptureMode::Logical, true, _) => Err(
            "--drop removes triggers; in mode: logical drop the publication and the slot \
             (pg_drop_replication_slot) yourself"
                .to_owned(),
        ),
    };
    match sql {
        Ok(sql) => print_out(&sql),
        Err(e) => {
            eprintln!("sidecache capture-ddl: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// `check --db`: the capture database fits the mapping.
fn check_db(cfg: &Config) -> ExitCode {
    use sidecache::invalidation::capture::{self, CaptureError};
    let Some(capture) = &cfg.invalidation.capture else {
        println!("no invalidation.capture: no database to check");
        return ExitCode::SUCCESS;
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sidecache check: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(capture::check(capture)) {
        Ok(()) => {
            println!(
                "invalidation.capture: every mapped table and column exists ({} mode)",
                capture.mode.as_str()
            );
            ExitCode::SUCCESS
        }
        Err(e @ CaptureError::Schema(_)) => {
            eprintln!("sidecache check: {e}");
            ExitCode::from(EXIT_CONFIG)
        }
        Err(e) => {
            eprintln!("sidecache check: cannot check the capture database: {e}");
            ExitCode::FAILURE
        }
    }
}

fn lookup(cfg: &Config, url: &str, headers: &[String], json: bool) -> ExitCode {
    use sidecache::lookup;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sidecache lookup: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(lookup::fetch(cfg, url, headers)) {
        Ok(answer) if json => {
            println!("{answer:#}");
            ExitCode::SUCCESS
        }
        Ok(answer) => {
            print!("{}", lookup::table(&answer));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sidecache lookup: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(path: PathBuf, cfg: Config) -> ExitCode {
    init_tracing(cfg.log_format);
    for w in &cfg.warnings {
        tracing::warn!(path = %w.path, "config: {}", w.message);
    }
    let runtime = match runtime(&cfg.server) {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        // A mapping that names a table or column the database lacks would
        // capture nothing: refused by name. A database that is down is the
        // capture's own business (it retries).
        if let Some(capture) = &cfg.invalidation.capture {
            use sidecache::invalidation::capture::{self, CaptureError};
            match capture::check(capture).await {
                Ok(()) => {}
                Err(e @ CaptureError::Schema(_)) => {
                    tracing::error!("{e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
                Err(e) => tracing::warn!(error = %e, "cannot check the capture database yet"),
            }
        }
        match sidecache::App::start(path, cfg).await {
            Ok(app) => {
                app.run_until(sidecache::shutdown_signal()).await;
                ExitCode::SUCCESS
            }
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "cannot start");
                ExitCode::FAILURE
            }
        }
    })
}

/// The runtime the app runs on (`server.runtime`): in `multi_thread`, the
/// one that serves everything (`server.workers` threads if set, else
/// tokio's default, which honours `TOKIO_WORKER_THREADS`); in `per_core`,
/// a current-thread runtime for all but the client listener, whose workers
/// have their own (see the library's `server::layout`).
fn runtime(cfg: &ServerConfig) -> std::io::Result<tokio::runtime::Runtime> {
    match cfg.runtime {
        RuntimeLayout::MultiThread => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if let Some(n) = cfg.workers {
                builder.worker_threads(n);
            }
            builder.enable_all().build()
        }
        RuntimeLayout::PerCore => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    }
}

/// Logs to stderr; level from `SIDECACHE_LOG` (default `info`).
fn init_tracing(format: FileLogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_env("SIDECACHE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        FileLogFormat::Json => builder.json().init(),
        FileLogFormat::Text => builder.init(),
    }
}

fn print_routes(path: &Path, cfg: &Config) {
    println!(
        "{}: OK, listen {}, admin {}, upstream {}://{}, store {}",
        path.display(),
        cfg.listen,
        cfg.admin.listen,
        cfg.upstream.scheme,
        cfg.upstream.authority,
        if cfg.store.redis.is_some() {
            "redis".to_owned()
        } else {
            format!("embedded (max_bytes {})", cfg.store.memory_max_bytes)
        },
    );
    println!(
        "{:<16} {:<10} {:<40} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>14} {:>8} {:>8} {:>8}  {:<10} {:<10} CLIENT_CC",
        "NAME",
        "METHODS",
        "PATH",
        "TTL",
        "MAX_TTL",
        "DEF_TTL",
        "JITTER",
        "NEG_TTL",
        "GRACE",
        "STALE_IF_ERROR",
        "KEEP",
        "LEASE",
        "WAIT",
        "QUERY",
        "VARY"
    );
    let dash = || "-".to_owned();
    for r in &cfg.routes.routes {
        let methods: Vec<&str> = r.methods.iter().map(|m| m.as_str()).collect();
        let query = match &r.query {
            QueryMode::Include => "include".to_owned(),
            QueryMode::Ignore => "ignore".to_owned(),
            QueryMode::Allow(names) => format!("[{}]", names.join(",")),
        };
        let vary: Vec<&str> = r.vary.iter().map(|h| h.as_str()).collect();
        let (max_ttl, default_ttl) = r
            .ttl
            .origin_caps()
            .map_or((dash(), dash()), |(max, default)| {
                (format!("{max:?}"), format!("{default:?}"))
            });
        println!(
            "{:<16} {:<10} {:<40} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>14} {:>8} {:>8} {:>8}  {:<10} {:<10} {}",
            r.name,
            methods.join(","),
            r.template,
            r.ttl.to_string(),
            max_ttl,
            default_ttl,
            format!("{:?}", r.jitter),
            format!("{:?}", r.negative_ttl),
            format!("{:?}", r.grace),
            format!("{:?}", r.stale_if_error),
            format!("{:?}", r.keep),
            format!("{:?}", r.lease),
            format!("{:?}", r.wait),
            query,
            if vary.is_empty() {
                dash()
            } else {
                vary.join(",")
            },
            r.client_cache_control,
        );
    }
    println!("{} route(s)", cfg.routes.routes.len());
    // Dependent invalidation (docs/invalidation.md#dependent-invalidation), for
    // routes that use it.
    for r in &cfg.routes.routes {
        let mut deps = Vec::new();
        if !r.also_invalidates.is_empty() {
            let names: Vec<&str> = r
                .also_invalidates
                .iter()
                .map(|x| x.route.as_str())
                .collect();
            deps.push(format!("also invalidates {}", names.join(", ")));
        }
        if let Some(h) = &r.tags_from {
            deps.push(format!("tags from {h}"));
        }
        if let Some(h) = &r.version_from {
            deps.push(format!("version from {h}"));
        }
        if !deps.is_empty() {
            println!("{}: {}", r.name, deps.join("; "));
        }
    }
}
