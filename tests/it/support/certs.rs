//! Test certificates made with the `openssl` command in a temporary
//! directory: a CA, a server certificate for `localhost` and `127.0.0.1`,
//! a client certificate (mTLS), a second, unrelated CA (the "wrong CA"),
//! and `ip-only`, signed by the CA for `127.0.0.1` only (so a client that
//! connects to `localhost` sees a certificate for another name), and
//! `named`, for [`NAMED`] only (a name no resolver knows: reachable only
//! with `store.redis.tls.server_name`).
//! A missing `openssl` fails the test with the reason.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The only name in the `named` certificate.
pub const NAMED: &str = "redis.sidecache.test";

pub struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    pub fn generate() -> Certs {
        let certs = Certs {
            dir: tempfile::tempdir().expect("temp dir for certificates"),
        };
        certs.ca("ca");
        certs.ca("other-ca");
        certs.leaf("server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1");
        certs.leaf("client", "ca", "extendedKeyUsage=clientAuth");
        certs.leaf("ip-only", "ca", "subjectAltName=IP:127.0.0.1");
        certs.leaf("named", "ca", &format!("subjectAltName=DNS:{NAMED}"));
        certs
    }

    /// `<name>.pem` (certificate) in the directory.
    pub fn cert(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.pem"))
    }

    /// `<name>.key` (private key) in the directory.
    pub fn key(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.key"))
    }

    fn ca(&self, name: &str) {
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN=sidecache test {name}"),
            "-keyout",
            path(&self.key(name)),
            "-out",
            path(&self.cert(name)),
        ]);
    }

    fn leaf(&self, name: &str, ca: &str, ext: &str) {
        let csr = self.dir.path().join(format!("{name}.csr"));
        let ext_file = self.dir.path().join(format!("{name}.ext"));
        std::fs::write(&ext_file, format!("{ext}\n")).expect("write extension file");
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            path(&self.key(name)),
            "-out",
            path(&csr),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            path(&csr),
            "-CA",
            path(&self.cert(ca)),
            "-CAkey",
            path(&self.key(ca)),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            path(&ext_file),
            "-out",
            path(&self.cert(name)),
        ]);
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `openssl` (install it, e.g. apt-get install openssl): {e}")
        });
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
