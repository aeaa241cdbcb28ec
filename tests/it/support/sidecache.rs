//! Runs the real `sidecache` binary for a test. See the API summary in
//! `support/mod.rs`.

use super::client;
use std::fs;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Startup (to `/readyz` 200) must finish within this time.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The `routes:` section most tests use: the `app` route at
/// `/api/tenants/{tenant}/apps/{id}` (tenant `[A-Za-z0-9_-]{1,64}`, id
/// `[1-9][0-9]{0,17}`, `ttl: 60s`) plus `keys`, more keys of that route
/// written at the route's own level (`"negative_ttl: 2s\nwait: 5s"`; a
/// nested block keeps its relative indentation). Further routes can be
/// appended as `  - name: ...` items. `app_routes("")` is the default.
pub fn app_routes(keys: &str) -> String {
    let mut yaml = String::from(
        r#"routes:
  - name: app
    path: /api/tenants/{tenant}/apps/{id}
    params:
      tenant: "[A-Za-z0-9_-]{1,64}"
      id: "[1-9][0-9]{0,17}"
    ttl: 60s
"#,
    );
    for line in keys.lines().filter(|l| !l.trim().is_empty()) {
        yaml.push_str("    ");
        yaml.push_str(line);
        yaml.push('\n');
    }
    yaml
}

/// Builds a config and starts the binary. Sections are whole top-level YAML
/// blocks (`store:\n  ...`, `routes:\n  ...`); `{upstream}` in any of them
/// is replaced by the upstream URL.
#[derive(Clone, Debug)]
pub struct SidecacheBuilder {
    upstream: String,
    upstream_timeout: String,
    token: Option<String>,
    store: String,
    fill: String,
    routes: String,
    extra: String,
    env: Vec<(String, String)>,
    listen: Option<SocketAddr>,
    admin: Option<SocketAddr>,
    stdout_unread: bool,
}

impl SidecacheBuilder {
    pub fn new(upstream_url: impl Into<String>) -> SidecacheBuilder {
        SidecacheBuilder {
            upstream: upstream_url.into(),
            upstream_timeout: "10s".into(),
            token: None,
            store: String::new(),
            fill: String::new(),
            routes: app_routes(""),
            extra: String::new(),
            env: Vec::new(),
            listen: None,
            admin: None,
            stdout_unread: false,
        }
    }
    /// stdout (the access log) goes into a pipe nobody reads: once the
    /// pipe is full, every write to it blocks.
    pub fn stdout_unread(mut self) -> Self {
        self.stdout_unread = true;
        self
    }
    /// `upstream.timeout`, e.g. `"500ms"`.
    pub fn upstream_timeout(mut self, d: &str) -> Self {
        self.upstream_timeout = d.into();
        self
    }
    /// `admin.token`.
    pub fn token(mut self, token: &str) -> Self {
        self.token = Some(token.into());
        self
    }
    /// The whole `store:` section (default: none, i.e. the embedded store).
    pub fn store(mut self, yaml: &str) -> Self {
        self.store = yaml.into();
        self
    }
    /// `redis`'s store if given, else the embedded one (the tests that run
    /// on both).
    pub fn store_on(self, redis: Option<&super::redis::RedisServer>) -> Self {
        match redis {
            Some(r) => self.store(&r.store_yaml()),
            None => self,
        }
    }
    /// The whole `fill:` section.
    pub fn fill(mut self, yaml: &str) -> Self {
        self.fill = yaml.into();
        self
    }
    /// The whole `routes:` section (default `app_routes("")`).
    pub fn routes(mut self, yaml: &str) -> Self {
        self.routes = yaml.into();
        self
    }
    /// Any other top-level YAML (e.g. `invalidation:`), appended as is.
    pub fn extra(mut self, yaml: &str) -> Self {
        self.extra = yaml.into();
        self
    }
    /// An environment variable for the child (e.g. `SIDECACHE_LOG`).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
    /// Fixes the listen addresses (normally picked free by `start`).
    pub fn addrs(mut self, listen: SocketAddr, admin: SocketAddr) -> Self {
        self.listen = Some(listen);
        self.admin = Some(admin);
        self
    }

    /// The config text for the current addresses.
    pub fn render(&self) -> String {
        let listen = self
            .listen
            .map(|a| a.to_string())
            .unwrap_or_else(|| "127.0.0.1:0".into());
        let admin = self
            .admin
            .map(|a| a.to_string())
            .unwrap_or_else(|| "127.0.0.1:0".into());
        let token = match &self.token {
            Some(t) => format!("  token: \"{t}\"\n"),
            None => String::new(),
        };
        let text = format!(
            "version: 1\nlisten: \"{{listen}}\"\nadmin:\n  listen: \"{{admin}}\"\n{token}\
             upstream:\n  url: \"{{upstream}}\"\n  connect_timeout: 1s\n  timeout: {}\n\
             {}\n{}\n{}\n{}\n",
            self.upstream_timeout, self.store, self.fill, self.routes, self.extra
        );
        text.replace("{listen}", &listen)
            .replace("{admin}", &admin)
            .replace("{upstream}", &self.upstream)
    }

    /// Starts the binary on free loopback ports and waits for `/readyz`.
    /// Panics (with the child's stderr) if it does not become ready.
    pub async fn start(self) -> Sidecache {
        let fixed = self.listen.is_some();
        let mut last_err = String::new();
        for _attempt in 0..3 {
            let mut b = self.clone();
            if !fixed {
                // Both held at once, so the kernel cannot hand out one twice.
                let (listen, admin) = (free_listener(), free_listener());
                b.listen = Some(listen.local_addr().expect("local_addr"));
                b.admin = Some(admin.local_addr().expect("local_addr"));
            }
            match Sidecache::spawn(b).await {
                Ok(sc) => return sc,
                // Another process took a port between picking and binding.
                Err(e) if !fixed && e.contains("Address already in use") => last_err = e,
                Err(e) => panic!("sidecache did not start:\n{e}"),
            }
        }
        panic!("sidecache did not start after 3 attempts:\n{last_err}")
    }
}

/// A free loopback address (bound, then released for the child to take).
pub fn free_addr() -> SocketAddr {
    free_listener().local_addr().expect("local_addr")
}

fn free_listener() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")
}

/// `sidecache capture-ddl` for the builder's config: the SQL that change
/// capture needs (`invalidation.capture`).
pub fn capture_ddl(builder: &SidecacheBuilder) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("sidecache.yaml");
    // Any two addresses: capture-ddl binds nothing.
    let builder = builder.clone().addrs(
        "127.0.0.1:1".parse().expect("addr"),
        "127.0.0.1:2".parse().expect("addr"),
    );
    fs::write(&path, builder.render()).expect("write config");
    let out = Command::new(binary())
        .args(["capture-ddl", "--config"])
        .arg(&path)
        .output()
        .expect("run sidecache capture-ddl");
    assert!(
        out.status.success(),
        "capture-ddl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("SQL is UTF-8")
}

pub fn binary() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_sidecache"));
    assert!(
        path.exists(),
        "sidecache binary missing at {} (cargo build?)",
        path.display()
    );
    path
}

/// A running sidecache child process; killed on drop (its stderr tail is
/// printed if the test is panicking).
pub struct Sidecache {
    child: Child,
    dir: tempfile::TempDir,
    builder: SidecacheBuilder,
    listen: SocketAddr,
    admin: SocketAddr,
    stderr: PathBuf,
}

impl Sidecache {
    /// Default config (embedded store, `app_routes("")`) for `upstream_url`.
    pub async fn start(upstream_url: &str) -> Sidecache {
        SidecacheBuilder::new(upstream_url).start().await
    }

    async fn spawn(b: SidecacheBuilder) -> Result<Sidecache, String> {
        let (listen, admin) = (b.listen.expect("listen set"), b.admin.expect("admin set"));
        let dir = tempfile::tempdir().expect("tempdir");
        // The config gets a directory of its own: sidecache watches it, and
        // a log file written there would trigger a reload per log line.
        fs::create_dir(dir.path().join("config")).expect("mkdir config");
        let config = dir.path().join("config/sidecache.yaml");
        fs::write(&config, b.render()).expect("write config");
        let stderr = dir.path().join("stderr.log");
        // The access log's destination.
        let stdout = dir.path().join("stdout.log");
        let mut cmd = Command::new(binary());
        cmd.arg("run")
            .arg("--config")
            .arg(&config)
            .env_remove("SIDECACHE_CONFIG")
            .stdin(Stdio::null())
            .stdout(if b.stdout_unread {
                Stdio::piped()
            } else {
                Stdio::from(fs::File::create(&stdout).expect("stdout file"))
            })
            .stderr(fs::File::create(&stderr).expect("stderr file"));
        for (k, v) in &b.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", binary().display()))?;
        let mut sc = Sidecache {
            child,
            dir,
            builder: b,
            listen,
            admin,
            stderr,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = sc.child.try_wait() {
                return Err(format!(
                    "exited with {status} before ready; stderr:\n{}",
                    sc.stderr_tail(40)
                ));
            }
            if let Ok(resp) =
                client::try_get(&sc.admin_url("/readyz"), Duration::from_secs(2)).await
            {
                if resp.status == 200 {
                    return Ok(sc);
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "not ready within {START_TIMEOUT:?}; stderr:\n{}",
                    sc.stderr_tail(40)
                ));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// `http://LISTEN{path}` on the client-facing listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.listen, path)
    }
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("config/sidecache.yaml")
    }
    /// The watched directory holding the config file.
    pub fn config_dir(&self) -> PathBuf {
        self.dir.path().join("config")
    }
    /// The builder this instance runs with (addresses fixed), to render a
    /// changed config: `sc.builder().routes(..).render()`.
    pub fn builder(&self) -> SidecacheBuilder {
        self.builder.clone()
    }
    /// Replaces the config file the way editors do: write a temp file in
    /// the same directory, then rename it over the config.
    pub fn rewrite_config(&self, yaml: &str) {
        let tmp = self.config_dir().join(".sidecache.yaml.tmp");
        fs::write(&tmp, yaml).expect("write temp config");
        fs::rename(&tmp, self.config_path()).expect("rename config");
    }
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    pub fn sighup(&self) {
        self.signal("HUP");
    }
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {} failed", self.pid());
    }
    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
    /// Waits (bounded) for the process to exit on its own.
    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "sidecache still running after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    /// Peak resident set size in KiB (`VmHWM`).
    pub fn peak_rss_kib(&self) -> u64 {
        self.proc_status_kib("VmHWM:")
    }
    /// Resident set size now in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        self.proc_status_kib("VmRSS:")
    }
    fn proc_status_kib(&self, field: &str) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in /proc/PID/status"))
    }
    /// What the child wrote to stdout: the access log.
    pub fn stdout_text(&self) -> String {
        fs::read_to_string(self.dir.path().join("stdout.log")).unwrap_or_default()
    }
    /// The access log's JSON lines so far (`access_log.format: json`).
    pub fn access_log_json(&self) -> Vec<serde_json::Value> {
        self.stdout_text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }
    pub fn stderr_text(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }
    pub fn stderr_tail(&self, lines: usize) -> String {
        let text = self.stderr_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
    /// The Prometheus text from `/metrics`.
    pub async fn metrics(&self) -> String {
        let resp = client::get(&self.admin_url("/metrics")).await;
        assert_eq!(resp.status, 200, "/metrics answered {}", resp.status);
        resp.text()
    }
    /// The sum of the samples of `name` whose labels include all of
    /// `labels` (in any order); 0 when there is none.
    pub async fn metric_sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let text = self.metrics().await;
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter(|l| {
                labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
    /// The value of one sample, e.g.
    /// `metric("sidecache_config_reloads_total{outcome=\"rejected\"}")`;
    /// `None` if absent. Labels must be written in exposition order.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        let text = self.metrics().await;
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                l.strip_prefix(sample)
                    .and_then(|rest| rest.strip_prefix(' '))
            })
            .and_then(|v| v.trim().parse().ok())
    }
}

impl Drop for Sidecache {
    fn drop(&mut self) {
        self.kill();
        // For a post-mortem of runs that pass (the history checker's
        // rare failures): every instance's log, named by when it ended.
        if let Ok(dir) = std::env::var("SIDECACHE_TEST_LOGS") {
            let ended = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let kept = fs::create_dir_all(&dir)
                .and_then(|()| fs::copy(&self.stderr, format!("{dir}/{ended}.log")));
            if let Err(e) = kept {
                eprintln!(
                    "SIDECACHE_TEST_LOGS: cannot keep {}: {e}",
                    self.stderr.display()
                );
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "---- sidecache stderr (last 60 lines, {}) ----\n{}\n----",
                self.stderr.display(),
                self.stderr_tail(60)
            );
        }
    }
}
