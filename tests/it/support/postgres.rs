//! Test harness: a private Postgres from the system binaries
//! (`/usr/lib/postgresql/*/bin`, or `SIDECACHE_TEST_PG_BIN`) in a temporary
//! directory on a free loopback port, which tests may kill (SIGKILL, like a
//! machine crash) and restart with the same data. Never the shared instance
//! on 5432 (docs/testing.md#test-harness).
//!
//! As root the server runs as the `postgres` user via `runuser -u postgres
//! --` (Postgres refuses to run as root; there is no sudo here), and the
//! temporary directory is handed to that user. Authentication is `trust`
//! for user `postgres` on loopback. Missing binaries fail the test with the
//! reason; nothing is skipped.
//!
//! `client().await` opens a tokio-postgres connection whose driver runs on a
//! spawned task (fine for queries; a LISTEN needs its own driver).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::certs::Certs;

const READY_WITHIN: Duration = Duration::from_secs(30);

pub struct PostgresServer {
    port: u16,
    bin: PathBuf,
    dir: tempfile::TempDir,
    as_postgres_user: bool,
    /// Extra `-c name=value` server settings, kept for restarts.
    settings: Vec<String>,
    /// TLS only on TCP (`ssl=on`, `hostssl` in `pg_hba.conf`); the harness
    /// itself then connects over the Unix socket.
    tls_only: bool,
    child: Mutex<Option<Child>>,
}

fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("SIDECACHE_TEST_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path().join("bin")))
                .filter(|p| p.join("postgres").exists() && p.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!(
            "no Postgres server binaries under /usr/lib/postgresql/*/bin: install \
             postgresql (e.g. apt-get install postgresql) or set SIDECACHE_TEST_PG_BIN; \
             tests that need Postgres fail rather than skip"
        )
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0 to find a free port")
}

impl PostgresServer {
    /// initdb + start on a free port; waits until it accepts connections.
    pub fn start() -> PostgresServer {
        PostgresServer::start_inner(&[], None)
    }

    /// Like [`PostgresServer::start`], with extra server settings
    /// (`"track_commit_timestamp=on"`), kept across restarts.
    pub fn start_with(settings: &[&str]) -> PostgresServer {
        PostgresServer::start_inner(settings, None)
    }

    /// Like [`PostgresServer::start`], but TCP clients must use TLS: `ssl=on`
    /// with `certs`' `ip-only` certificate (valid for 127.0.0.1, not for
    /// localhost) and only `hostssl` lines (plus `local`, for the harness)
    /// in `pg_hba.conf`.
    pub fn start_tls(certs: &Certs) -> PostgresServer {
        PostgresServer::start_inner(&[], Some(certs))
    }

    fn start_inner(settings: &[&str], certs: Option<&Certs>) -> PostgresServer {
        let bin = bin_dir();
        let as_postgres_user = is_root();
        let dir = tempfile::tempdir().expect("create a temp dir for postgres");
        if as_postgres_user {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("run chown");
            assert!(status.success(), "chown of the postgres temp dir failed");
        }
        let mut server = PostgresServer {
            port: 0,
            bin,
            dir,
            as_postgres_user,
            settings: settings.iter().map(|s| s.to_string()).collect(),
            tls_only: certs.is_some(),
            child: Mutex::new(None),
        };
        let out = server
            .command("initdb")
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "-D",
            ])
            .arg(server.data_dir())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run initdb: {e}"));
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(certs) = certs {
            server.configure_tls(certs);
        }
        let mut last_error = String::new();
        for _ in 0..5 {
            server.port = free_port();
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("could not start postgres: {last_error}");
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// TLS-only server: certificate and key in the data directory (the
    /// server wants its key private to its user), `hostssl` only.
    fn configure_tls(&self, certs: &Certs) {
        let data = self.data_dir();
        std::fs::copy(certs.cert("ip-only"), data.join("server.crt")).expect("copy server cert");
        std::fs::copy(certs.key("ip-only"), data.join("server.key")).expect("copy server key");
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\n",
        )
        .expect("write pg_hba.conf");
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .expect("open postgresql.conf");
        std::io::Write::write_all(
            &mut conf,
            b"ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
        )
        .expect("append to postgresql.conf");
        use std::os::unix::fs::PermissionsExt;
        let key = data.join("server.key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
            .expect("chmod server.key");
        if self.as_postgres_user {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&data)
                .status()
                .expect("run chown");
            assert!(status.success(), "chown of the postgres data dir failed");
        }
    }

    /// `postgres://postgres@<host>:<port>/postgres?<query>`, for TLS tests
    /// that vary the host name and the ssl settings.
    pub fn url_with(&self, host: &str, query: &str) -> String {
        format!("postgres://postgres@{host}:{}/postgres?{query}", self.port)
    }

    /// A connection with its driver spawned on the current runtime (over
    /// the Unix socket for a TLS-only server).
    pub async fn client(&self) -> tokio_postgres::Client {
        let conninfo = if self.tls_only {
            format!(
                "host={} port={} user=postgres dbname=postgres",
                self.dir.path().display(),
                self.port
            )
        } else {
            self.url()
        };
        let (client, connection) = tokio_postgres::connect(&conninfo, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect to test postgres: {e}"));
        tokio::spawn(connection);
        client
    }

    /// Runs SQL (several statements allowed) on a fresh connection.
    pub async fn execute(&self, sql: &str) {
        self.client()
            .await
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("SQL failed: {e}\n{sql}"));
    }

    /// SIGKILL to the server's process group: no shutdown, connections
    /// reset, uncommitted transactions lost; data survives (WAL).
    pub fn kill(&self) {
        let child = self.child.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut child) = child {
            let pgid = child.id();
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pgid}")])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
        // The postmaster itself (runuser may have forked it): its pid file.
        if let Some(pid) = self.postmaster_pid() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }

    /// Kills the server if running and starts it again on the same port
    /// with the same data (crash recovery runs); waits until ready.
    pub fn restart(&self) {
        self.kill();
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            // Backends of the killed postmaster exit on their own shortly;
            // until then the new one refuses the old shared memory.
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(e) if Instant::now() >= deadline => panic!("postgres restart: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres_user {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn postmaster_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data_dir().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// `postmaster.pid` line 8 says `ready` once connections are accepted.
    fn is_ready(&self) -> bool {
        std::fs::read_to_string(self.data_dir().join("postmaster.pid"))
            .map(|t| t.lines().nth(7).is_some_and(|l| l.trim() == "ready"))
            .unwrap_or(false)
    }

    fn spawn_and_wait(&self) -> Result<(), String> {
        use std::os::unix::process::CommandExt;
        // After a kill the old postmaster's pid file still says `ready`:
        // only a file the new postmaster wrote counts.
        let stale = self.postmaster_pid();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .map_err(|e| format!("open postgres log: {e}"))?;
        let mut cmd = self.command("postgres");
        cmd.arg("-D")
            .arg(self.data_dir())
            .args(["-p", &self.port.to_string(), "-h", "127.0.0.1", "-k"])
            .arg(self.dir.path())
            .args([
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=50",
                // A backend notices a vanished client within 100 ms even
                // while it waits, so a killed worker's claim is released.
                "-c",
                "client_connection_check_interval=100ms",
            ]);
        for setting in &self.settings {
            cmd.args(["-c", setting]);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot spawn postgres: {e}"))?;
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(status) = self.exited() {
                self.child.lock().unwrap_or_else(|p| p.into_inner()).take();
                return Err(format!(
                    "postgres on port {} exited with {status}; log tail:\n{}",
                    self.port,
                    tail(&self.log_path())
                ));
            }
            if self.is_ready()
                && self.postmaster_pid() != stale
                && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "postgres on port {} not ready within {READY_WITHIN:?}; log tail:\n{}",
                    self.port,
                    tail(&self.log_path())
                ));
            }
            // Fine-grained: the history test counts changes hidden by a
            // restart from when this returns.
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn exited(&self) -> Option<std::process::ExitStatus> {
        let mut guard = self.child.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.kill();
    }
}
