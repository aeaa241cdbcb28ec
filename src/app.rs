//! Wiring, the one place that builds the parts and hands each what it
//! needs: metrics, the store, the upstream client, the Bloom filter manager,
//! the invalidator (and its background sources), the read pipeline; binds
//! both listeners (the client one once per worker with `server.runtime:
//! per_core`, see `server::layout`), starts the reload watcher, owns the
//! readiness flag, and
//! runs until a shutdown signal, then drains in-flight requests within a
//! bounded time.

use crate::access_log::AccessLog;
use crate::admin::{self, AdminState};
use crate::bloom::source::{IdSource, PgSource};
use crate::bloom::Blooms;
use crate::config::{watch, Config, RuntimeLayout};
use crate::invalidation::{self, Invalidator};
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::proxy::client::UpstreamClient;
use crate::proxy::upload::UploadBudget;
use crate::server::{self, layout, ProxyState};
use crate::store;
use anyhow::Context;
use arc_swap::ArcSwap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch as signal_watch;
use tracing::{info, warn};

/// How long in-flight requests get to finish after a shutdown signal.
const DRAIN: Duration = Duration::from_secs(10);

/// A started sidecache: listeners bound, background tasks running.
pub struct App {
    pub proxy_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    ready: Arc<AtomicBool>,
    /// Stops the client listener; the admin listener has its own signal so
    /// probes and scrapes keep working (readyz 503) while requests drain.
    stop_proxy: signal_watch::Sender<bool>,
    stop_admin: signal_watch::Sender<bool>,
    proxy_task: tokio::task::JoinHandle<()>,
    admin_task: tokio::task::JoinHandle<()>,
    /// Stops the outbox worker and stream consumer (after the proxy drained).
    stop_invalidation: signal_watch::Sender<bool>,
    invalidation_tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl App {
    /// Builds everything and binds both listeners. `config_path` is watched
    /// for reloads. Fails only for what an operator must fix (a port in use,
    /// an unwatchable directory); Redis being down is not one of them.
    pub async fn start(config_path: PathBuf, cfg: Config) -> anyhow::Result<App> {
        let metrics = Metrics::new();
        let store = store::open(&cfg.store, &metrics)
            .await
            .context("cannot open the cache store")?;
        let client = UpstreamClient::new(&cfg.upstream);
        let blooms = Blooms::new(store.clone(), bloom_source(&cfg), &metrics.registry);
        let pipeline = Arc::new(Pipeline::new(
            store.clone(),
            client.clone(),
            blooms.clone(),
            metrics.clone(),
            &cfg,
        ));
        let (listen, admin_listen) = (cfg.listen, cfg.admin.listen);
        let config = Arc::new(ArcSwap::from_pointee(cfg));
        blooms.spawn_maintenance(config.clone());
        let invalidator = Arc::new(Invalidator::new(
            config.clone(),
            store.clone(),
            Some(blooms.clone()),
            metrics.clone(),
        ));
        let ready = Arc::new(AtomicBool::new(false));
        let (stop_proxy, proxy_stopped) = signal_watch::channel(false);
        let (stop_admin, admin_stopped) = signal_watch::channel(false);
        let (stop_invalidation, invalidation_stopped) = signal_watch::channel(false);
        let invalidation_tasks =
            invalidation::spawn_sources(&config.load(), &invalidator, &invalidation_stopped);

        let reconfigure = pipeline.clone();
        watch::spawn(config_path, config.clone(), metrics.clone(), move |next| {
            reconfigure.reconfigure(next)
        })
        .context("cannot watch the config file")?;

        let admin_listener = TcpListener::bind(admin_listen)
            .await
            .with_context(|| format!("cannot bind admin.listen {admin_listen}"))?;
        let server_cfg = config.load().server;
        let proxy_listeners = match server_cfg.runtime {
            RuntimeLayout::MultiThread => ProxyListeners::One(
                TcpListener::bind(listen)
                    .await
                    .with_context(|| format!("cannot bind listen {listen}"))?,
            ),
            RuntimeLayout::PerCore => ProxyListeners::PerCore(
                layout::bind_reuseport(listen, layout::worker_count(&server_cfg))
                    .with_context(|| format!("cannot bind listen {listen}"))?,
            ),
        };
        let proxy_addr = proxy_listeners.local_addr()?;
        let admin_addr = admin_listener.local_addr()?;

        let admin_state = Arc::new(AdminState {
            config: config.clone(),
            invalidator: invalidator.clone(),
            blooms,
            store,
            metrics: metrics.clone(),
            ready: ready.clone(),
            started: tokio::time::Instant::now(),
        });
        // Started whether or not it is enabled: a reload can turn it on.
        let access_log = AccessLog::start(config.load().access_log.buffer, &metrics)
            .context("cannot start the access log")?;
        let limit = server::connection_limit(config.clone(), &metrics);
        let upstream = config.load().upstream.clone();
        // Everything but the forwarding pool is shared by all workers.
        let uploads = UploadBudget::new(
            metrics.request_buffer_reserved.clone(),
            metrics.request_buffer_bytes.clone(),
        );
        let proxy_state = move |client: UpstreamClient| {
            Arc::new(ProxyState {
                config: config.clone(),
                pipeline: pipeline.clone(),
                invalidator: invalidator.clone(),
                client,
                metrics: metrics.clone(),
                access_log: access_log.clone(),
                uploads: uploads.clone(),
            })
        };
        let proxy_task = match proxy_listeners {
            ProxyListeners::One(listener) => tokio::spawn(server::serve(
                listener,
                proxy_state(client),
                limit,
                proxy_stopped,
                DRAIN,
            )),
            ProxyListeners::PerCore(listeners) => {
                // Each worker's own pool, made on the worker (its reaper
                // and connections are that runtime's tasks).
                let state = Arc::new(move || proxy_state(UpstreamClient::new(&upstream)));
                let workers = layout::start_workers(listeners, state, limit, proxy_stopped, DRAIN)
                    .await
                    .context("cannot start the per-core workers")?;
                tokio::spawn(async move {
                    for worker in workers {
                        // An error: the worker died; nothing left to wait for.
                        let _ = worker.await;
                    }
                })
            }
        };
        let admin_task = tokio::spawn(admin::run(
            admin_listener,
            admin_state,
            admin_stopped,
            Duration::from_secs(1),
        ));
        ready.store(true, Ordering::Release);
        info!(listen = %proxy_addr, admin = %admin_addr, "sidecache ready");
        Ok(App {
            proxy_addr,
            admin_addr,
            ready,
            stop_proxy,
            stop_admin,
            proxy_task,
            admin_task,
            stop_invalidation,
            invalidation_tasks,
        })
    }

    /// Serves until `shutdown` resolves, then stops accepting, reports not
    /// ready, and waits (bounded) for in-flight requests.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) {
        shutdown.await;
        info!("shutting down: draining in-flight requests");
        self.ready.store(false, Ordering::Release);
        let _ = self.stop_proxy.send(true);
        if let Err(e) = self.proxy_task.await {
            warn!(error = %e, "proxy listener task failed");
        }
        let _ = self.stop_invalidation.send(true);
        for task in self.invalidation_tasks {
            if tokio::time::timeout(DRAIN, task).await.is_err() {
                warn!("invalidation source did not stop in time");
            }
        }
        let _ = self.stop_admin.send(true);
        if let Err(e) = self.admin_task.await {
            warn!(error = %e, "admin listener task failed");
        }
        info!("stopped");
    }
}

/// The client listener as bound: one, or one per worker (`per_core`).
enum ProxyListeners {
    One(TcpListener),
    PerCore(Vec<std::net::TcpListener>),
}

impl ProxyListeners {
    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            ProxyListeners::One(l) => l.local_addr(),
            ProxyListeners::PerCore(ls) => ls
                .first()
                .ok_or_else(|| std::io::Error::other("no listener"))?
                .local_addr(),
        }
    }
}

/// The membership source of Bloom builds: `source` runs on
/// `invalidation.outbox.url`; without an outbox this instance builds no filters
/// (it still uses those other instances build; docs/bloom.md#builds).
fn bloom_source(cfg: &Config) -> Option<Arc<dyn IdSource>> {
    cfg.invalidation
        .outbox
        .as_ref()
        .map(|o| PgSource::new(o.url.clone()) as Arc<dyn IdSource>)
}

/// Resolves on the first SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        _ => {
            // Without signal handlers only Ctrl-C via tokio remains.
            warn!("cannot install SIGTERM/SIGINT handlers; falling back to ctrl_c");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received"),
        _ = int.recv() => info!("SIGINT received"),
    }
}
