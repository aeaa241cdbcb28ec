//! Test harness: Redis Sentinel processes (`redis-server <conf> --sentinel`)
//! on free loopback ports, monitoring a [`super::redis::RedisServer`]
//! primary, with a short `down-after-milliseconds` so a failover takes
//! seconds; optionally TLS-only, reaching the primary and replicas over TLS
//! (`tls-replication yes`). Killed on drop.

use super::certs::Certs;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const MASTER: &str = "mymaster";

struct Node {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

pub struct Sentinels {
    nodes: Vec<Node>,
    /// `Some`: TLS only; the harness's client certificates.
    tls: Option<redis::TlsCertificates>,
}

impl Sentinels {
    /// `n` sentinels (quorum `n / 2 + 1`) monitoring `127.0.0.1:primary_port`;
    /// returns once they know each other and `replicas` replicas.
    pub fn start(n: usize, primary_port: u16, replicas: usize) -> Sentinels {
        Sentinels::start_with(n, primary_port, replicas, None)
    }

    /// Like [`Sentinels::start`], TLS only with `certs`' `server`
    /// certificate (also presented as the client certificate to the
    /// primary and replicas), requiring client certificates.
    pub fn start_tls(n: usize, primary_port: u16, replicas: usize, certs: &Certs) -> Sentinels {
        Sentinels::start_with(n, primary_port, replicas, Some(certs))
    }

    fn start_with(
        n: usize,
        primary_port: u16,
        replicas: usize,
        certs: Option<&Certs>,
    ) -> Sentinels {
        let nodes = (0..n)
            .map(|_| Node::start(primary_port, n / 2 + 1, certs))
            .collect();
        let sentinels = Sentinels {
            nodes,
            tls: certs.map(super::redis::harness_certificates),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let known = |what: &str| match sentinels.cli(0, &["SENTINEL", what, MASTER]) {
                Ok(redis::Value::Array(items)) => items.len(),
                _ => 0,
            };
            if known("sentinels") == n - 1 && known("replicas") == replicas {
                return sentinels;
            }
            assert!(
                Instant::now() < deadline,
                "sentinels did not discover each other"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("{}://127.0.0.1:{}", self.scheme(), n.port))
            .collect()
    }

    fn scheme(&self) -> &'static str {
        match self.tls {
            Some(_) => "rediss",
            None => "redis",
        }
    }

    /// The port of the primary the first sentinel names now.
    pub fn primary_port(&self) -> Option<u16> {
        match self.cli(0, &["SENTINEL", "get-master-addr-by-name", MASTER]) {
            Ok(redis::Value::Array(items)) => match items.get(1) {
                Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).parse().ok(),
                _ => None,
            },
            _ => None,
        }
    }

    fn cli(&self, i: usize, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let url = format!("{}://127.0.0.1:{}", self.scheme(), self.nodes[i].port);
        let client = match &self.tls {
            Some(tls) => {
                // See `support::redis::command`.
                let _ = rustls::crypto::ring::default_provider().install_default();
                redis::Client::build_with_tls(url, tls.clone())?
            }
            None => redis::Client::open(url)?,
        };
        super::redis::command(&client, args)
    }
}

impl Node {
    fn start(primary_port: u16, quorum: usize, certs: Option<&Certs>) -> Node {
        let dir = tempfile::tempdir().expect("temp dir for a sentinel");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let conf = dir.path().join("sentinel.conf");
        let listen = match certs {
            None => format!("port {port}\n"),
            Some(certs) => format!(
                "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-ca-cert-file {}\ntls-auth-clients yes\ntls-replication yes\n",
                certs.cert("server").display(),
                certs.key("server").display(),
                certs.cert("ca").display()
            ),
        };
        std::fs::write(
            &conf,
            format!(
                "{listen}bind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                 sentinel monitor {MASTER} 127.0.0.1 {primary_port} {quorum}\n\
                 sentinel down-after-milliseconds {MASTER} 1000\n\
                 sentinel failover-timeout {MASTER} 10000\n",
                dir = dir.path().display()
            ),
        )
        .expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server --sentinel: {e}"));
        let node = Node {
            port,
            child,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "sentinel on {port} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        node
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
