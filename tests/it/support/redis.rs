//! Test harness: a private `redis-server` on a free loopback port in a
//! temporary directory, which tests may pause, kill and restart. Never the
//! shared instance on 6379 (docs/testing.md#test-harness): fault tests break
//! their own server.
//!
//! Every method is synchronous so it works from plain and async tests alike;
//! each blocks at most for a bounded readiness wait.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::certs::Certs;

/// The server binary; `SIDECACHE_TEST_REDIS_SERVER` overrides it.
fn binary() -> String {
    std::env::var("SIDECACHE_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

const READY_WITHIN: Duration = Duration::from_secs(10);

pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    /// Extra `redis-server` arguments (e.g. cluster mode), kept for restarts.
    extra_args: Vec<String>,
    /// `Some`: the server listens with TLS only (`--port 0 --tls-port`).
    /// Boxed: keeps `RedisServer` small in enums of backends.
    tls: Option<Box<ServerTls>>,
    /// `None` after `kill()`.
    child: Mutex<Option<Child>>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`.
    /// Panics with the reason (binary missing, server log) if it cannot.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Like [`RedisServer::start`], with extra `redis-server` arguments.
    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        RedisServer::start_inner(extra_args, None)
    }

    /// A server that speaks TLS only, with `certs`' certificate `server`
    /// (`"server"` or `"ip-only"`); with `require_client_cert` it refuses clients without a certificate
    /// signed by `certs`' CA. The harness's own commands present `client`.
    pub fn start_tls(certs: &Certs, server: &str, require_client_cert: bool) -> RedisServer {
        let tls = ServerTls::new(certs, server, require_client_cert);
        RedisServer::start_inner(&[], Some(Box::new(tls)))
    }

    /// A TLS-only replica (certificate `server`: `"server"` or `"named"`,
    /// also its client certificate towards `primary`) of the TLS-only
    /// `primary`, replicating over TLS and requiring client certificates,
    /// once its link is up.
    pub fn start_tls_replica_of(primary: &RedisServer, certs: &Certs, server: &str) -> RedisServer {
        let port = primary.port.to_string();
        let args = [
            "--replicaof",
            "127.0.0.1",
            &port,
            "--tls-replication",
            "yes",
        ];
        let tls = ServerTls::new(certs, server, true);
        let replica = RedisServer::start_inner(&args, Some(Box::new(tls)));
        replica.wait_info("the replica's link to its primary", "master_link_status:up");
        replica
    }

    fn start_inner(extra_args: &[&str], tls: Option<Box<ServerTls>>) -> RedisServer {
        let cluster = extra_args.contains(&"--cluster-enabled");
        // A port found free can be taken by another process before the
        // server binds it: try a few ports.
        let mut last_error = String::new();
        for _ in 0..5 {
            let port = if cluster {
                free_cluster_port()
            } else {
                free_port()
            };
            let server = RedisServer {
                port,
                dir: tempfile::tempdir().expect("create a temp dir for redis-server"),
                extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
                tls: tls.clone(),
                child: Mutex::new(None),
            };
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("could not start redis-server: {last_error}");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A replica of `primary` (`--replicaof`), once its link is up.
    pub fn start_replica_of(primary: &RedisServer) -> RedisServer {
        let port = primary.port.to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
        replica.wait_info("the replica's link to its primary", "master_link_status:up");
        replica
    }

    /// Polls `INFO replication` until it contains `needle` (10 s at most).
    pub fn wait_info(&self, what: &str, needle: &str) {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let info = self.cli(&["INFO", "replication"]);
            if matches!(&info, Ok(redis::Value::VerbatimString { text, .. }) if text.contains(needle))
                || matches!(&info, Ok(redis::Value::BulkString(b)) if String::from_utf8_lossy(b).contains(needle))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: no {needle:?} in {info:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis://127.0.0.1:<port>/0` (`rediss://` for a TLS server)
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/0", self.port)
    }

    /// The `store:` section of a sidecache config on this server.
    pub fn store_yaml(&self) -> String {
        format!(
            "store:\n  redis:\n    url: \"{}\"\n    command_timeout: 300ms\n  breaker:\n    cooldown: 500ms\n",
            self.url()
        )
    }

    /// Runs one raw command on a fresh connection, e.g. `cli(&["SCRIPT", "FLUSH"])`.
    /// `GET key`: the value's bytes, or `None` when the key is absent.
    pub fn get_bytes(&self, key: &str) -> Option<Vec<u8>> {
        match self.cli(&["GET", key]) {
            Ok(redis::Value::BulkString(v)) => Some(v),
            Ok(redis::Value::Nil) => None,
            other => panic!("GET {key}: {other:?}"),
        }
    }

    /// `XPENDING stream group`: how many entries the group has pending.
    pub fn xpending(&self, stream: &str, group: &str) -> i64 {
        match self.cli(&["XPENDING", stream, group]) {
            Ok(redis::Value::Array(items)) => match items.first() {
                Some(redis::Value::Int(n)) => *n,
                other => panic!("XPENDING: {other:?}"),
            },
            other => panic!("XPENDING: {other:?}"),
        }
    }

    pub fn cli(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let client = match &self.tls {
            None => redis::Client::open(self.url())?,
            Some(tls) => match tls.harness_port {
                Some(port) => redis::Client::open(format!("redis://127.0.0.1:{port}/0"))?,
                None => redis::Client::build_with_tls(self.url(), tls.certificates())?,
            },
        };
        command(&client, args)
    }

    /// `CLIENT PAUSE <ms> ALL`: every client's commands block for `ms`.
    pub fn pause(&self, ms: u64) {
        self.cli(&["CLIENT", "PAUSE", &ms.to_string(), "ALL"])
            .expect("CLIENT PAUSE");
    }

    /// SIGSTOP: the process stops where it is (a replica stops acknowledging
    /// replication) until [`RedisServer::resume`].
    pub fn stop(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after [`RedisServer::stop`].
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let guard = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let child = guard.as_ref().expect("the server is running");
        let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
        // SAFETY: kill(2) on our own child's pid; no memory is shared.
        #[allow(unsafe_code)]
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "kill({pid}, {signal})");
    }

    /// SIGKILL: no shutdown, connections are reset.
    pub fn kill(&self) {
        let child = self.child.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut child) = child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if running, starts it again on the same port and
    /// waits until it answers. Data is gone (no persistence).
    pub fn restart(&self) {
        self.kill();
        // The port was just ours; redis-server binds with SO_REUSEADDR, but
        // allow a short retry in case the old socket lingers.
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(e) if Instant::now() >= deadline => panic!("redis-server restart: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn spawn_and_wait(&self) -> Result<(), String> {
        let port = self.port.to_string();
        let listen: Vec<String> = match &self.tls {
            None => vec!["--port".into(), port.clone()],
            Some(tls) => tls.args(&port),
        };
        let spawned = Command::new(binary())
            .args(&listen)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) if e.kind() == ErrorKind::NotFound => panic!(
                "`{}` not found on PATH: install redis-server (e.g. apt-get install \
                 redis-server) or set SIDECACHE_TEST_REDIS_SERVER; tests that need \
                 Redis fail rather than skip",
                binary()
            ),
            Err(e) => panic!("cannot spawn {}: {e}", binary()),
        };
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);

        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(status) = self.exited() {
                self.kill();
                return Err(format!(
                    "redis-server on port {port} exited with {status}; log:\n{}",
                    std::fs::read_to_string(self.log_path()).unwrap_or_default()
                ));
            }
            if matches!(self.cli(&["PING"]), Ok(redis::Value::SimpleString(ref s)) if s == "PONG") {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!("redis-server on port {port} did not answer PING"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn exited(&self) -> Option<std::process::ExitStatus> {
        let mut guard = self.child.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs one raw command on a fresh connection of `client`.
pub fn command(client: &redis::Client, args: &[&str]) -> redis::RedisResult<redis::Value> {
    // As sidecache does (`tls::use_ring`): two rustls providers are
    // compiled in, so the harness's TLS clients must name one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(1))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut conn)
}

/// Certificates of a TLS-only server and of the harness as its client.
#[derive(Clone)]
struct ServerTls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    require_client_cert: bool,
    /// A plain-text port for the harness's own commands (certificate
    /// `named` only); sidecache is only given the TLS port.
    harness_port: Option<u16>,
}

impl ServerTls {
    fn new(certs: &Certs, server: &str, require_client_cert: bool) -> ServerTls {
        // The harness cannot verify `named` against 127.0.0.1 (redis-rs
        // checks the host it connects to), so it gets a plain port.
        let harness_port = (server == "named").then(free_port);
        ServerTls {
            harness_port,
            ca: certs.cert("ca"),
            cert: certs.cert(server),
            key: certs.key(server),
            client_cert: certs.cert("client"),
            client_key: certs.key("client"),
            require_client_cert,
        }
    }

    fn args(&self, port: &str) -> Vec<String> {
        let path = |p: &PathBuf| p.display().to_string();
        let auth = if self.require_client_cert {
            "yes"
        } else {
            "no"
        };
        [
            "--port",
            &self.harness_port.unwrap_or(0).to_string(),
            "--tls-port",
            port,
            "--tls-cert-file",
            &path(&self.cert),
            "--tls-key-file",
            &path(&self.key),
            "--tls-ca-cert-file",
            &path(&self.ca),
            "--tls-auth-clients",
            auth,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn certificates(&self) -> redis::TlsCertificates {
        client_certificates(&self.ca, &self.client_cert, &self.client_key)
    }
}

/// The harness's own client certificates for a TLS server of `certs`.
pub fn harness_certificates(certs: &Certs) -> redis::TlsCertificates {
    client_certificates(
        &certs.cert("ca"),
        &certs.cert("client"),
        &certs.key("client"),
    )
}

fn client_certificates(ca: &Path, cert: &Path, key: &Path) -> redis::TlsCertificates {
    let read = |p: &Path| std::fs::read(p).expect("read a test certificate");
    redis::TlsCertificates {
        client_tls: Some(redis::ClientTlsConfig {
            client_cert: read(cert),
            client_key: read(key),
        }),
        root_cert: Some(read(ca)),
    }
}

/// A free port whose cluster bus port (`port + 10000`) is free too.
fn free_cluster_port() -> u16 {
    for _ in 0..100 {
        let port = free_port();
        if port <= u16::MAX - 10_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair (port, port + 10000) on 127.0.0.1");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0 to find a free port")
}

/// A Redis Cluster of `n` masters (no replicas), each a [`RedisServer`] in
/// cluster mode, created with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start(n: usize) -> RedisCluster {
        RedisCluster::start_with(n, &[])
    }

    /// Like [`RedisCluster::start`], with extra `redis-server` arguments
    /// for every node (e.g. `--cluster-require-full-coverage no`).
    pub fn start_with(n: usize, extra_args: &[&str]) -> RedisCluster {
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ];
        args.extend_from_slice(extra_args);
        let nodes: Vec<RedisServer> = (0..n).map(|_| RedisServer::start_with(&args)).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli to create the cluster: {e}"));
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        // Every node must agree the cluster is up before clients route.
        let deadline = Instant::now() + READY_WITHIN;
        for node in &nodes {
            loop {
                let info = node.cli(&["CLUSTER", "INFO"]);
                let ok = matches!(&info, Ok(redis::Value::BulkString(b))
                    if String::from_utf8_lossy(b).contains("cluster_state:ok"));
                if ok {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster not ok: {info:?}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        RedisCluster { nodes }
    }

    /// A new node joined as a replica of `master` (one of `nodes`), once
    /// its replication link is up.
    pub fn add_replica(&self, master: &RedisServer) -> RedisServer {
        let args: Vec<&str> = master.extra_args.iter().map(String::as_str).collect();
        let replica = RedisServer::start_with(&args);
        let id = match master.cli(&["CLUSTER", "MYID"]) {
            Ok(redis::Value::BulkString(id)) => String::from_utf8_lossy(&id).into_owned(),
            other => panic!("CLUSTER MYID: {other:?}"),
        };
        let output = Command::new("redis-cli")
            .args(["--cluster", "add-node"])
            .arg(format!("127.0.0.1:{}", replica.port))
            .arg(format!("127.0.0.1:{}", master.port))
            .args(["--cluster-slave", "--cluster-master-id", &id])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli to add a replica: {e}"));
        assert!(
            output.status.success(),
            "redis-cli --cluster add-node failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        replica.wait_info("the replica's link to its master", "master_link_status:up");
        master.wait_info("the master sees its replica", "connected_slaves:1");
        replica
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
    }

    /// The node serving `key` (the one that answers a harmless read of it
    /// instead of `MOVED`).
    pub fn owner(&self, key: &str) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.cli(&["TYPE", key]).is_ok())
            .unwrap_or_else(|| panic!("no cluster node serves {key}"))
    }

    /// Runs one raw command on every node.
    pub fn cli_all(&self, args: &[&str]) {
        for node in &self.nodes {
            node.cli(args).expect("command on a cluster node");
        }
    }

    /// Moves `slot` with its keys from `from` to `to` (the resharding steps
    /// `redis-cli --cluster reshard` takes), and tells every node.
    pub fn move_slot(&self, slot: &str, from: &RedisServer, to: &RedisServer) {
        let from_id = text(from.cli(&["CLUSTER", "MYID"]));
        let to_id = text(to.cli(&["CLUSTER", "MYID"]));
        to.cli(&["CLUSTER", "SETSLOT", slot, "IMPORTING", &from_id])
            .expect("IMPORTING");
        from.cli(&["CLUSTER", "SETSLOT", slot, "MIGRATING", &to_id])
            .expect("MIGRATING");
        let keys = match from.cli(&["CLUSTER", "GETKEYSINSLOT", slot, "100"]) {
            Ok(redis::Value::Array(keys)) => keys,
            other => panic!("GETKEYSINSLOT: {other:?}"),
        };
        let port = to.port().to_string();
        let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        let names: Vec<String> = keys.into_iter().map(|k| text(Ok(k))).collect();
        migrate.extend(names.iter().map(String::as_str));
        from.cli(&migrate).expect("MIGRATE");
        for node in &self.nodes {
            node.cli(&["CLUSTER", "SETSLOT", slot, "NODE", &to_id])
                .expect("SETSLOT NODE");
        }
    }
}

/// A string reply as text.
fn text(v: redis::RedisResult<redis::Value>) -> String {
    match v {
        Ok(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
        Ok(redis::Value::SimpleString(s)) => s,
        other => panic!("expected a string, got {other:?}"),
    }
}
