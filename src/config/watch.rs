//! Hot reload (docs/architecture.md#hot-reload): watches the config file's
//! directory, debounces, re-reads, and swaps the whole [`Config`] atomically
//! when the new file is valid, different, and changes nothing that needs a
//! restart. SIGHUP triggers the same reload.
//!
//! The directory, not the file, is watched: editors save by writing a temp
//! file and renaming it over the old one (the old inode's watch goes dead),
//! and Kubernetes swaps a `..data` symlink without any event for the config
//! file's own name. Any event in the directory therefore triggers a re-read;
//! the content digest keeps unrelated events from doing anything.

use super::Config;
use crate::metrics::Metrics;
use arc_swap::ArcSwap;
use notify::{EventKind, RecursiveMode};
use notify_debouncer_full::{new_debouncer, DebounceEventResult};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// Editors and `kubectl` write in several steps; wait for them to settle.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// What one reload attempt did; the string is the metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReloadOutcome {
    Applied,
    Unchanged,
    Rejected,
}

impl ReloadOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReloadOutcome::Applied => "applied",
            ReloadOutcome::Unchanged => "unchanged",
            ReloadOutcome::Rejected => "rejected",
        }
    }
}

/// Starts watching. The returned task runs until the runtime stops; the
/// SIGHUP handler is installed before this returns, so a SIGHUP sent after
/// readiness never hits the default action (terminate). `applied` runs after
/// each config swap, for what must follow the new config (limits).
pub(crate) fn spawn(
    path: PathBuf,
    current: Arc<ArcSwap<Config>>,
    metrics: Metrics,
    applied: impl Fn(&Config) + Send + 'static,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let mut debouncer = new_debouncer(DEBOUNCE, None, move |res: DebounceEventResult| match res {
        Ok(events) => {
            // Our own reads of the file show up as access events; they
            // must not trigger another read.
            if events
                .iter()
                .any(|e| !matches!(e.kind, EventKind::Access(_)))
            {
                let _ = tx.send(());
            }
        }
        Err(errors) => warn!(?errors, "config watch error"),
    })?;
    let dir = watch_dir(&path);
    debouncer.watch(&dir, RecursiveMode::NonRecursive)?;
    let mut hangup = signal(SignalKind::hangup())?;
    info!(dir = %dir.display(), "watching config directory");

    Ok(tokio::spawn(async move {
        // The debouncer stops watching when dropped: keep it in the task.
        let _debouncer = debouncer;
        let mut reloader = Reloader::new(path, current, applied);
        loop {
            let trigger = tokio::select! {
                got = rx.recv() => match got {
                    Some(()) => "file",
                    None => return,
                },
                _ = hangup.recv() => "sighup",
            };
            // Coalesce triggers that queued up while we were busy.
            while rx.try_recv().is_ok() {}
            let outcome = reloader.reload();
            if outcome == ReloadOutcome::Unchanged {
                debug!(trigger, outcome = outcome.as_str(), "config reload");
            } else {
                info!(trigger, outcome = outcome.as_str(), "config reload");
            }
            metrics
                .config_reloads
                .with_label_values(&[outcome.as_str()])
                .inc();
            match outcome {
                ReloadOutcome::Applied => metrics.config_reload_ok.set(1),
                ReloadOutcome::Rejected => metrics.config_reload_ok.set(0),
                // Back to the running content after a rejected edit.
                ReloadOutcome::Unchanged if reloader.file_is_running() => {
                    metrics.config_reload_ok.set(1)
                }
                ReloadOutcome::Unchanged => {}
            }
            if outcome != ReloadOutcome::Unchanged {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                metrics.config_reload_time.set(now.as_secs_f64());
            }
        }
    }))
}

fn watch_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Reload attempts against one file. Remembers the digest of the last
/// content it looked at, so a file that was rejected is warned about once,
/// not on every later event (a log file written into the config's directory
/// would otherwise make each warning trigger the next).
pub(crate) struct Reloader<F> {
    path: PathBuf,
    current: Arc<ArcSwap<Config>>,
    applied: F,
    last_seen: [u8; 32],
}

impl<F: Fn(&Config)> Reloader<F> {
    pub(crate) fn new(path: PathBuf, current: Arc<ArcSwap<Config>>, applied: F) -> Self {
        let last_seen = current.load().digest;
        Reloader {
            path,
            current,
            applied,
            last_seen,
        }
    }

    /// Whether the file, as last read, is the running config.
    pub(crate) fn file_is_running(&self) -> bool {
        self.last_seen == self.current.load().digest
    }

    /// One reload attempt. The running config stays unless the new one is
    /// valid, different and reloadable.
    pub(crate) fn reload(&mut self) -> ReloadOutcome {
        let text = match Config::read(&self.path) {
            Ok(text) => text,
            Err(e) => {
                warn!(error = %e, "config reload rejected; the running config stays");
                return ReloadOutcome::Rejected;
            }
        };
        let digest = Config::digest_of(&text);
        if digest == self.last_seen {
            return ReloadOutcome::Unchanged;
        }
        self.last_seen = digest;
        let next = match Config::from_file_text(&self.path, &text) {
            Ok(next) => next,
            Err(e) => {
                warn!(error = %e, "config reload rejected; the running config stays");
                return ReloadOutcome::Rejected;
            }
        };
        let running = self.current.load();
        if running.digest == digest {
            // Back to the running content after a rejected edit.
            return ReloadOutcome::Unchanged;
        }
        let needs_restart = running.restart_only_changes(&next);
        if !needs_restart.is_empty() {
            warn!(
                fields = ?needs_restart,
                "config change needs a restart; refused, the running config stays"
            );
            return ReloadOutcome::Rejected;
        }
        let next = Arc::new(next);
        self.current.store(next.clone());
        (self.applied)(&next);
        info!(routes = next.routes.routes.len(), "config reloaded");
        ReloadOutcome::Applied
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "version: 1\nlisten: 127.0.0.1:1\nadmin: { listen: 127.0.0.1:2 }\n\
                        upstream: { url: \"http://127.0.0.1:3\" }\nroutes: []\n";

    #[test]
    fn a_rejected_file_is_rejected_once_per_content() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sidecache.yaml");
        std::fs::write(&path, GOOD).expect("write");
        let current = Arc::new(ArcSwap::from_pointee(Config::load(&path).expect("good")));
        let applied = std::sync::atomic::AtomicUsize::new(0);
        let mut reloader = Reloader::new(path.clone(), current.clone(), |_: &Config| {
            applied.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        assert_eq!(reloader.reload(), ReloadOutcome::Unchanged);

        std::fs::write(&path, format!("{GOOD}colour: blue\n")).expect("write");
        assert_eq!(reloader.reload(), ReloadOutcome::Rejected);
        // Later events with the same bad content: nothing new to say.
        assert_eq!(reloader.reload(), ReloadOutcome::Unchanged);
        assert_eq!(reloader.reload(), ReloadOutcome::Unchanged);
        // Another bad content is warned about again.
        std::fs::write(&path, format!("{GOOD}colour: red\n")).expect("write");
        assert_eq!(reloader.reload(), ReloadOutcome::Rejected);

        let fixed = GOOD.replace("routes: []", "routes: []\nlog_format: json");
        std::fs::write(&path, &fixed).expect("write");
        assert_eq!(
            reloader.reload(),
            ReloadOutcome::Rejected,
            "log_format needs a restart"
        );
        std::fs::write(
            &path,
            GOOD.replace(
                "admin: { listen: 127.0.0.1:2 }",
                "admin: { listen: 127.0.0.1:2, token: t }",
            ),
        )
        .expect("write");
        assert_eq!(reloader.reload(), ReloadOutcome::Applied);
        assert_eq!(applied.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(current.load().admin.token.as_deref(), Some("t"));
        // Back to a content seen before (the original): a real change again.
        std::fs::write(&path, GOOD).expect("write");
        assert_eq!(reloader.reload(), ReloadOutcome::Applied);
    }
}
