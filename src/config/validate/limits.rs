//! `limits` and `h2`: what one client connection may cost, and what
//! forwarded request bodies may hold.

use super::{err, Result};
use crate::config::file::FileConfig;
use crate::config::{path, LimitsConfig, UploadConfig};
use std::time::Duration;

pub(super) fn limits(raw: &FileConfig) -> Result<LimitsConfig> {
    let l = &raw.limits;
    let max_connections = match l.max_connections {
        Some(0) => return err("limits.max_connections", "must be at least 1"),
        Some(n) => n,
        None => default_max_connections(open_files_limit()),
    };
    for (field, d) in [
        ("header_timeout", l.header_timeout.0),
        ("idle_timeout", l.idle_timeout.0),
        ("send_timeout", l.send_timeout.0),
    ] {
        if d < Duration::from_millis(100) {
            return err(format!("limits.{field}"), "must be at least 100ms");
        }
    }
    // hyper's HTTP/1 read buffer cannot be smaller than 8 KiB; a head
    // larger than 1 MiB is no longer a request head but an attack.
    let max_header_bytes = l.max_header_bytes.0;
    if !(8 * 1024..=1024 * 1024).contains(&max_header_bytes) {
        return err("limits.max_header_bytes", "must be between 8KiB and 1MiB");
    }
    // A target longer than the head is a 431 before it could be a 414.
    let max_target_bytes = l.max_target_bytes.0;
    if !(1024..=max_header_bytes).contains(&max_target_bytes) {
        return err(
            "limits.max_target_bytes",
            "must be between 1KiB and limits.max_header_bytes",
        );
    }
    if raw.h2.max_concurrent_streams == 0 {
        return err("h2.max_concurrent_streams", "must be at least 1");
    }
    Ok(LimitsConfig {
        max_connections,
        header_timeout: l.header_timeout.0,
        max_header_bytes: max_header_bytes as usize,
        idle_timeout: l.idle_timeout.0,
        send_timeout: l.send_timeout.0,
        h2_max_concurrent_streams: raw.h2.max_concurrent_streams,
        max_target_bytes: max_target_bytes as usize,
    })
}

pub(super) fn uploads(raw: &FileConfig) -> Result<UploadConfig> {
    let l = &raw.limits;
    let (buffer, budget) = (l.request_buffer.0, l.request_buffer_budget.0);
    // 0 turns buffering off; one body must fit the budget, or no upload
    // could ever be buffered.
    if budget < buffer {
        return err(
            "limits.request_buffer_budget",
            "must be at least limits.request_buffer",
        );
    }
    if l.body_timeout.0 < Duration::from_millis(100) {
        return err("limits.body_timeout", "must be at least 100ms");
    }
    for (i, prefix) in l.stream_uploads.iter().enumerate() {
        // Matched against the normal form of request paths: a prefix that
        // is not one itself would never match.
        let normal =
            prefix.starts_with('/') && path::normalize(prefix).ok().as_deref() == Some(prefix);
        if !normal {
            return err(
                format!("limits.stream_uploads[{i}]"),
                format!("{prefix:?} must be a path in normal form starting with '/'"),
            );
        }
    }
    let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    Ok(UploadConfig {
        buffer: size(buffer),
        budget: size(budget),
        body_timeout: l.body_timeout.0,
        stream: l.stream_uploads.clone(),
    })
}

/// The default `limits.max_connections` for a process allowed `nofile`
/// open files: a forwarded request holds two descriptors (the client's and
/// an upstream connection), and 64 are kept for the listeners, Redis,
/// Postgres, the config watcher and the pool's idle connections. So the cap
/// is reached before `accept` fails with EMFILE, and an accepted client can
/// still reach the upstream. At most 10 000; at least 1.
fn default_max_connections(nofile: u64) -> usize {
    let usable = nofile.saturating_sub(64) / 2;
    usable.clamp(1, 10_000) as usize
}

/// The soft `RLIMIT_NOFILE` of this process (what `accept` runs into);
/// unknown counts as unlimited.
fn open_files_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass, which outlives the call.
    #[allow(unsafe_code)]
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    if ok && limit.rlim_cur != libc::RLIM_INFINITY {
        limit.rlim_cur
    } else {
        u64::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{err, parse, APP};

    #[test]
    fn max_connections_from_nofile() {
        assert_eq!(default_max_connections(1024), 480);
        assert_eq!(default_max_connections(65_536), 10_000);
        assert_eq!(default_max_connections(10), 1);
        assert_eq!(default_max_connections(u64::MAX), 10_000);
    }

    #[test]
    fn limits_defaults_errors_and_reload() {
        let cfg = parse(APP).expect("valid");
        let l = cfg.limits;
        assert_eq!(l.header_timeout, Duration::from_secs(10));
        assert_eq!(l.max_header_bytes, 64 * 1024);
        assert_eq!(l.idle_timeout, Duration::from_secs(60));
        assert_eq!(l.send_timeout, Duration::from_secs(30));
        assert_eq!(l.h2_max_concurrent_streams, 100);
        assert!((1..=10_000).contains(&l.max_connections));
        assert_eq!(l.max_target_bytes, 8 * 1024);
        let u = &cfg.uploads;
        assert_eq!((u.buffer, u.budget), (1 << 20, 64 << 20));
        assert_eq!(u.body_timeout, Duration::from_secs(30));
        assert!(u.stream.is_empty());

        let set = parse(&format!(
            "limits: {{ max_connections: 7, header_timeout: 2s, max_header_bytes: 16KiB, \
             idle_timeout: 500ms, send_timeout: 3s }}\nh2: {{ max_concurrent_streams: 9 }}\n{APP}"
        ))
        .expect("valid");
        assert_eq!(set.limits.max_connections, 7);
        assert_eq!(set.limits.max_header_bytes, 16 * 1024);
        assert_eq!(set.limits.h2_max_concurrent_streams, 9);

        let set_uploads = parse(&format!(
            "limits: {{ max_target_bytes: 2KiB, request_buffer: 0, request_buffer_budget: 1MiB, \
             body_timeout: 5s, stream_uploads: [/upload, /files/] }}\n{APP}"
        ))
        .expect("valid");
        assert_eq!(set_uploads.limits.max_target_bytes, 2048);
        let u = &set_uploads.uploads;
        assert_eq!((u.buffer, u.budget), (0, 1 << 20));
        assert!(u.streams("/upload") && u.streams("/upload/a") && u.streams("/files/x"));
        assert!(!u.streams("/uploads") && !u.streams("/files") && !u.streams("/up"));
        // Matched on the normal form: no way out of a prefix with `..`.
        assert!(!u.streams("/upload/../api") && u.streams("/x/../upload/a"));
        assert!(cfg.restart_only_changes(&set_uploads).is_empty());
        // Nothing in `limits` or `h2` needs a restart.
        assert!(cfg.restart_only_changes(&set).is_empty());

        for (yaml, path) in [
            ("limits: { max_connections: 0 }", "limits.max_connections"),
            ("limits: { header_timeout: 10ms }", "limits.header_timeout"),
            (
                "limits: { max_header_bytes: 1KiB }",
                "limits.max_header_bytes",
            ),
            ("limits: { send_timeout: 0s }", "limits.send_timeout"),
            ("limits: { idle: 1s }", "limits"),
            (
                "limits: { max_target_bytes: 128KiB }",
                "limits.max_target_bytes",
            ),
            (
                "limits: { request_buffer: 2MiB, request_buffer_budget: 1MiB }",
                "limits.request_buffer_budget",
            ),
            ("limits: { body_timeout: 0s }", "limits.body_timeout"),
            (
                "limits: { stream_uploads: [/a, up] }",
                "limits.stream_uploads[1]",
            ),
            (
                "limits: { stream_uploads: [/a/../b] }",
                "limits.stream_uploads[0]",
            ),
            (
                "h2: { max_concurrent_streams: 0 }",
                "h2.max_concurrent_streams",
            ),
        ] {
            let e = err(&format!("{yaml}\n{APP}"));
            assert!(e.contains(path), "{yaml}: {e}");
        }
    }
}
