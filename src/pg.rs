//! Connecting to Postgres (the outbox worker and the Bloom source): the one
//! place that reads a libpq-style connection string, including the TLS
//! settings tokio-postgres does not know, and opens a connection over
//! rustls.
//!
//! `sslmode` follows libpq: `disable` (plain), `prefer` (the default: TLS if
//! the server offers it), `require` (TLS or fail), `verify-ca` (TLS and a
//! certificate chain to a trusted root), `verify-full` (and the host name
//! on the certificate). As in libpq, `prefer` and `require` encrypt without
//! checking the certificate unless `sslrootcert` is given, in which case
//! the chain is checked (`verify-ca`). `sslrootcert` is a PEM bundle path,
//! or `system` for the operating system's roots (the default of the
//! `verify-*` modes here). tokio-postgres only knows `disable|prefer|require`
//! and rejects `sslrootcert`, so both are taken out of the string first.
//!
//! A certificate that fails the check is [`PgError::Certificate`], naming
//! `sslmode` and `sslrootcert`; nothing ever falls back to plain text
//! except `prefer` against a server without TLS, which is what it means.

use percent_encoding::percent_decode_str;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::fmt;
use std::sync::Arc;
use tokio_postgres::config::SslMode as PgSslMode;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::Socket;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The stream type of a connection made by [`PgConnector::connect`].
pub(crate) type TlsStream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;
/// A connection made by [`PgConnector::connect`]; poll it (or spawn it).
pub(crate) type Connection = tokio_postgres::Connection<Socket, TlsStream>;

/// `sslmode` of a connection string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, PgError> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(PgError::Config(format!(
                "sslmode {other:?} is not one of disable, prefer, require, verify-ca, verify-full"
            )))
            }
        })
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// What failed, by meaning. Never holds the connection string (passwords).
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// The connection string or a file it names is unusable: fix the config.
    #[error("{0}")]
    Config(String),
    /// The server's certificate could not be proven. Not retried into
    /// plain text: fix `sslrootcert`, the host name, or the server.
    #[error("TLS certificate check failed (sslmode={mode}, sslrootcert={rootcert}): {detail}")]
    Certificate {
        mode: &'static str,
        rootcert: String,
        detail: String,
    },
    /// Anything else (refused, authentication, pg_hba, network).
    #[error("postgres (sslmode={mode}): {detail}")]
    Postgres {
        mode: &'static str,
        /// The server's message where there is one ("db error" says nothing).
        detail: String,
        #[source]
        source: tokio_postgres::Error,
    },
}

/// A parsed connection string and the TLS connector it asks for. Parse once
/// per connect (cheap) or keep it; `config` may be tuned before connecting.
pub struct PgConnector {
    pub config: tokio_postgres::Config,
    mode: SslMode,
    /// `None`: the system's roots (or no check at all, see the module doc).
    rootcert: Option<String>,
    tls: MakeRustlsConnect,
}

impl fmt::Debug for PgConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConnector")
            .field("mode", &self.mode)
            .field("rootcert", &self.rootcert)
            .finish_non_exhaustive()
    }
}

impl PgConnector {
    /// Parses a `postgres://` URL or a key=value string and loads the root
    /// certificates it names. Errors name the setting, never the string.
    pub fn parse(conninfo: &str) -> Result<PgConnector, PgError> {
        let (rest, ssl) = split_ssl_params(conninfo);
        let mut config: tokio_postgres::Config = rest
            .parse()
            .map_err(|e| PgError::Config(format!("not a Postgres connection string: {e}")))?;
        let mode = match ssl.mode.as_deref() {
            Some(value) => SslMode::parse(value)?,
            None => SslMode::Prefer,
        };
        config.ssl_mode(match mode {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            _ => PgSslMode::Require,
        });
        let roots = match ssl.rootcert.as_deref() {
            None | Some("system") => None,
            Some(path) => Some(load_roots(path)?),
        };
        let check = match mode {
            SslMode::Disable => Check::Nothing,
            SslMode::Prefer | SslMode::Require if roots.is_none() => Check::Nothing,
            SslMode::Prefer | SslMode::Require | SslMode::VerifyCa => Check::Chain,
            SslMode::VerifyFull => Check::ChainAndName,
        };
        let tls = MakeRustlsConnect::new(client_config(check, roots)?);
        Ok(PgConnector {
            config,
            mode,
            rootcert: ssl.rootcert,
            tls,
        })
    }

    #[cfg(test)]
    pub(crate) fn mode(&self) -> SslMode {
        self.mode
    }

    /// Opens one connection. The caller drives the returned [`Connection`].
    pub async fn connect(&self) -> Result<(tokio_postgres::Client, Connection), PgError> {
        self.config
            .connect(self.tls.clone())
            .await
            .map_err(|e| self.classify(e))
    }

    /// The same server, user and TLS settings for a logical replication
    /// connection (change capture) reading `slot` through `publication`.
    /// TLS is pgwire-replication's own rustls client: `verify-*` without
    /// `sslrootcert` checks against the Mozilla roots it carries rather
    /// than the system's; give `sslrootcert` to pin a private CA.
    pub(crate) fn replication_config(
        &self,
        slot: &str,
        publication: &str,
    ) -> Result<pgwire_replication::ReplicationConfig, PgError> {
        use pgwire_replication::{ReplicationConfig, TlsConfig};
        use tokio_postgres::config::Host;
        let user = self.config.get_user().unwrap_or("postgres");
        let password = self
            .config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default();
        let database = self.config.get_dbname().unwrap_or(user);
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        let cfg = match self.config.get_hosts().first() {
            Some(Host::Tcp(host)) => {
                ReplicationConfig::new(host.as_str(), user, password, database, slot, publication)
            }
            Some(Host::Unix(dir)) => ReplicationConfig::unix(
                dir.to_string_lossy(),
                port,
                user,
                password,
                database,
                slot,
                publication,
            ),
            None => {
                ReplicationConfig::new("localhost", user, password, database, slot, publication)
            }
        };
        let ca: Option<std::path::PathBuf> = self
            .rootcert
            .clone()
            .filter(|r| r != "system")
            .map(Into::into);
        let tls = match (self.mode, ca) {
            (SslMode::Disable, _) => TlsConfig::disabled(),
            (SslMode::Prefer, None) => TlsConfig {
                mode: pgwire_replication::SslMode::Prefer,
                ..TlsConfig::require()
            },
            (SslMode::Require, None) => TlsConfig::require(),
            // As in libpq, a root certificate makes prefer/require check it.
            (SslMode::Prefer | SslMode::Require | SslMode::VerifyCa, ca) => {
                TlsConfig::verify_ca(ca)
            }
            (SslMode::VerifyFull, ca) => TlsConfig::verify_full(ca),
        };
        Ok(cfg.with_port(port).with_tls(tls))
    }

    fn classify(&self, e: tokio_postgres::Error) -> PgError {
        match crate::tls::rustls_failure(&e) {
            Some(detail) => PgError::Certificate {
                mode: self.mode.as_str(),
                rootcert: self.rootcert.clone().unwrap_or_else(|| "system".into()),
                detail,
            },
            None => PgError::Postgres {
                mode: self.mode.as_str(),
                detail: match e.as_db_error() {
                    Some(db) => db.message().to_owned(),
                    None => e.to_string(),
                },
                source: e,
            },
        }
    }
}

/// A TLS setting given both in the connection string and in the config,
/// with different values.
#[derive(Debug, thiserror::Error)]
#[error("{key} {config:?} conflicts with {key}={url:?} in the connection string")]
pub(crate) struct SslConflict {
    pub key: &'static str,
    pub config: String,
    pub url: String,
}

/// `conninfo` with `sslmode` / `sslrootcert` from the config added (the
/// config keys `invalidation.outbox.sslmode` / `sslrootcert`), so every
/// connection made from it has them. The same value in both places is
/// fine; different values are a conflict. `mode` is checked here too.
pub(crate) fn with_ssl(
    conninfo: &str,
    mode: Option<&str>,
    rootcert: Option<&str>,
) -> Result<String, SslSettingError> {
    if let Some(mode) = mode {
        SslMode::parse(mode).map_err(|e| SslSettingError::Invalid("sslmode", e.to_string()))?;
    }
    let (_, in_url) = split_ssl_params(conninfo);
    let mut out = conninfo.trim().to_owned();
    let url_form = out.starts_with("postgres://") || out.starts_with("postgresql://");
    for (key, config, url) in [
        ("sslmode", mode, in_url.mode),
        ("sslrootcert", rootcert, in_url.rootcert),
    ] {
        let Some(config) = config else { continue };
        match url {
            Some(url) if url != config => {
                return Err(SslSettingError::Conflict(SslConflict {
                    key,
                    config: config.to_owned(),
                    url,
                }))
            }
            Some(_) => {}
            None if url_form => {
                let sep = if out.contains('?') { '&' } else { '?' };
                let value = percent_encoding::utf8_percent_encode(
                    config,
                    percent_encoding::NON_ALPHANUMERIC,
                );
                out = format!("{out}{sep}{key}={value}");
            }
            None => {
                let value = config.replace('\\', "\\\\").replace('\'', "\\'");
                out = format!("{out} {key}='{value}'");
            }
        }
    }
    Ok(out)
}

/// Why [`with_ssl`] refused the config's TLS settings.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SslSettingError {
    #[error("{1}")]
    Invalid(&'static str, String),
    #[error(transparent)]
    Conflict(SslConflict),
}

impl SslSettingError {
    /// The setting at fault (`sslmode` or `sslrootcert`).
    pub(crate) fn key(&self) -> &'static str {
        match self {
            SslSettingError::Invalid(key, _) => key,
            SslSettingError::Conflict(c) => c.key,
        }
    }
}

#[derive(Debug, Default, PartialEq, Eq)]
struct SslParams {
    mode: Option<String>,
    rootcert: Option<String>,
}

/// Takes `sslmode` and `sslrootcert` out of a URL's query or a key=value
/// string; everything else is returned as written.
fn split_ssl_params(conninfo: &str) -> (String, SslParams) {
    let mut ssl = SslParams::default();
    let mut take = |key: &str, value: String| match key {
        "sslmode" => {
            ssl.mode = Some(value);
            true
        }
        "sslrootcert" => {
            ssl.rootcert = Some(value);
            true
        }
        _ => false,
    };
    let trimmed = conninfo.trim();
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        let Some((base, query)) = trimmed.split_once('?') else {
            return (trimmed.to_owned(), ssl);
        };
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                let value = percent_decode_str(value).decode_utf8_lossy().into_owned();
                !take(key, value)
            })
            .collect();
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return (rest, ssl);
    }
    let mut rest = String::new();
    for (key, value, raw) in key_values(trimmed) {
        if !take(key, value) {
            if !rest.is_empty() {
                rest.push(' ');
            }
            rest.push_str(raw);
        }
    }
    (rest, ssl)
}

/// `key = value` pairs of a libpq key=value string: (key, unquoted value,
/// the pair as written). Values may be single-quoted with `\` escapes.
/// Malformed input is passed through for tokio-postgres to report.
fn key_values(s: &str) -> Vec<(&str, String, &str)> {
    let mut out = Vec::new();
    let mut rest = s.trim_start();
    while !rest.is_empty() {
        let start = rest;
        let Some(eq) = rest.find('=') else {
            out.push(("", String::new(), start));
            break;
        };
        let key = rest[..eq].trim();
        rest = rest[eq + 1..].trim_start();
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = if rest.starts_with('\'') {
            chars.next();
            let mut end = rest.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    '\'' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            end
        } else {
            let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
            value.push_str(&rest[..end]);
            end
        };
        let raw_len = start.len() - rest.len() + end;
        out.push((key, value, &start[..raw_len]));
        rest = rest[end..].trim_start();
    }
    out
}

fn load_roots(path: &str) -> Result<RootCertStore, PgError> {
    let pem = std::fs::read(path)
        .map_err(|e| PgError::Config(format!("sslrootcert: cannot read {path:?}: {e}")))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert =
            cert.map_err(|e| PgError::Config(format!("sslrootcert {path:?}: bad PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| PgError::Config(format!("sslrootcert {path:?}: {e}")))?;
    }
    if roots.is_empty() {
        return Err(PgError::Config(format!(
            "sslrootcert {path:?}: no certificate in the file"
        )));
    }
    Ok(roots)
}

fn system_roots() -> Result<RootCertStore, PgError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        return Err(PgError::Config(
            "sslrootcert: no system root certificates found; give sslrootcert=<file>".into(),
        ));
    }
    Ok(roots)
}

/// What the client checks of the server's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// libpq's `prefer`/`require` without a root file: encryption only.
    Nothing,
    /// `verify-ca`: a chain to a trusted root; any host name.
    Chain,
    /// `verify-full`: the chain and the host name.
    ChainAndName,
}

fn client_config(
    check: Check,
    roots: Option<RootCertStore>,
) -> Result<rustls::ClientConfig, PgError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| PgError::Config(format!("TLS setup: {e}")))?;
    if check == Check::ChainAndName {
        let roots = match roots {
            Some(roots) => roots,
            None => system_roots()?,
        };
        return Ok(builder.with_root_certificates(roots).with_no_client_auth());
    }
    let webpki = match (check, roots) {
        (Check::Nothing, _) => None,
        (_, roots) => {
            let roots = match roots {
                Some(roots) => roots,
                None => system_roots()?,
            };
            Some(
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                    .build()
                    .map_err(|e| PgError::Config(format!("TLS setup: {e}")))?,
            )
        }
    };
    let verifier = Arc::new(LenientVerifier { webpki, provider });
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

/// `verify-ca` (a chain, any name) and libpq's unchecked `prefer`/`require`.
/// Handshake signatures are always checked, so the peer does hold the key
/// of the certificate it shows.
#[derive(Debug)]
struct LenientVerifier {
    /// `None`: the certificate itself is not checked.
    webpki: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for LenientVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(webpki) = &self.webpki else {
            return Ok(ServerCertVerified::assertion());
        };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> (String, Option<String>, Option<String>) {
        let (rest, ssl) = split_ssl_params(s);
        (rest, ssl.mode, ssl.rootcert)
    }

    #[test]
    fn config_ssl_settings_join_the_string_or_conflict() {
        let url = with_ssl("postgres://h/db", Some("require"), Some("/tmp/c a.pem")).unwrap();
        assert_eq!(
            url,
            "postgres://h/db?sslmode=require&sslrootcert=%2Ftmp%2Fc%20a%2Epem"
        );
        let (_, mode, root) = split(&url);
        assert_eq!(mode.as_deref(), Some("require"));
        assert_eq!(root.as_deref(), Some("/tmp/c a.pem"));
        let kv = with_ssl("host=h dbname=d", Some("verify-full"), Some("/x/it's.pem")).unwrap();
        let (_, mode, root) = split(&kv);
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("/x/it's.pem"));
        // Same value twice is fine; nothing is added.
        let same = with_ssl("postgres://h/db?sslmode=require", Some("require"), None).unwrap();
        assert_eq!(same, "postgres://h/db?sslmode=require");
        let conflict = with_ssl("host=h sslmode=disable", Some("require"), None).unwrap_err();
        assert_eq!(conflict.key(), "sslmode");
        assert!(conflict.to_string().contains("conflicts"), "{conflict}");
        let e = with_ssl("host=h", Some("allow"), None).unwrap_err();
        assert_eq!(e.key(), "sslmode");
        assert_eq!(with_ssl("host=h", None, None).unwrap(), "host=h");
    }

    #[test]
    fn ssl_params_leave_a_url() {
        let (rest, mode, root) = split(
            "postgres://u:p@h:5/db?sslmode=verify-full&application_name=x&sslrootcert=%2Ftmp%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u:p@h:5/db?application_name=x");
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("/tmp/ca.pem"));
        let (rest, mode, _) = split("postgresql://h/db?sslmode=disable");
        assert_eq!(
            (rest.as_str(), mode.as_deref()),
            ("postgresql://h/db", Some("disable"))
        );
    }

    #[test]
    fn ssl_params_leave_a_key_value_string() {
        let (rest, mode, root) = split(
            "host=h  sslmode = verify-ca password='a b\\'c' sslrootcert='/x y/ca.pem' dbname=d",
        );
        assert_eq!(rest, "host=h password='a b\\'c' dbname=d");
        assert_eq!(mode.as_deref(), Some("verify-ca"));
        assert_eq!(root.as_deref(), Some("/x y/ca.pem"));
        let parsed: tokio_postgres::Config = rest.parse().unwrap();
        assert_eq!(parsed.get_password(), Some(&b"a b'c"[..]));
    }

    #[test]
    fn modes_map_to_what_tokio_postgres_negotiates() {
        let c = PgConnector::parse("host=h").unwrap();
        assert_eq!(c.mode(), SslMode::Prefer);
        assert_eq!(c.config.get_ssl_mode(), PgSslMode::Prefer);
        let c = PgConnector::parse("postgres://h/db?sslmode=disable").unwrap();
        assert_eq!(c.config.get_ssl_mode(), PgSslMode::Disable);
        let c = PgConnector::parse("host=h sslmode=require").unwrap();
        assert_eq!(c.config.get_ssl_mode(), PgSslMode::Require);
    }

    #[test]
    fn bad_settings_name_themselves() {
        let e = PgConnector::parse("host=h sslmode=allow").unwrap_err();
        assert!(e.to_string().contains("sslmode \"allow\""), "{e}");
        let e = PgConnector::parse("host=h sslmode=verify-ca sslrootcert=/nonexistent/ca.pem")
            .unwrap_err();
        assert!(e.to_string().contains("sslrootcert: cannot read"), "{e}");
        let e = PgConnector::parse("host=h nonsense=1").unwrap_err();
        assert!(
            e.to_string().contains("not a Postgres connection string"),
            "{e}"
        );
    }
}
