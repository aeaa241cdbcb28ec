//! The example upstream (`examples/upstream.rs`) as a child process, in
//! Postgres mode. The example is built by the first test that needs it with
//! `cargo build --example upstream` (cargo prints where it put the
//! executable), since cargo provides `CARGO_BIN_EXE_*` only for `[[bin]]`
//! targets; later tests reuse that build.

use super::client;
use super::eventually;
use super::sidecache::free_addr;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// Builds the example once per test process with the same cargo and
/// returns the executable's path from cargo's JSON messages (robust to
/// `CARGO_TARGET_DIR` and profiles). Blocking: call it from
/// `spawn_blocking`.
pub fn build_example() -> String {
    static BUILT: OnceLock<String> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = Command::new(env!("CARGO"))
                .args([
                    "build",
                    "--example",
                    "upstream",
                    "--message-format=json-render-diagnostics",
                ])
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .stderr(Stdio::inherit())
                .output()
                .expect("run cargo build --example upstream");
            assert!(
                out.status.success(),
                "cargo build --example upstream failed"
            );
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
                .filter(|msg| {
                    msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "upstream"
                })
                .find_map(|msg| msg["executable"].as_str().map(str::to_owned))
                .expect("cargo reported no executable for the upstream example")
        })
        .clone()
}

/// The example upstream on Postgres; killed on drop.
pub struct Upstream {
    child: Child,
    addr: SocketAddr,
}

impl Upstream {
    /// Starts `binary` on a free port with `DATABASE_URL=database_url` and
    /// the extra `args` (e.g. `["--apps", "3"]`), and waits for `/healthz`.
    pub async fn start(binary: &str, database_url: &str, args: &[&str]) -> Upstream {
        let addr = free_addr();
        let child = Command::new(binary)
            .args(["--listen", &addr.to_string()])
            .args(args)
            .env("DATABASE_URL", database_url)
            // Warnings only: a history test makes thousands of changes.
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the example upstream");
        let upstream = Upstream { child, addr };
        let health = upstream.url("/healthz");
        eventually(
            "the example upstream answers /healthz",
            Duration::from_secs(30),
            || {
                let health = health.clone();
                async move {
                    client::try_get(&health, Duration::from_secs(1))
                        .await
                        .is_ok_and(|r| r.status == 200)
                }
            },
        )
        .await;
        upstream
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
