//! `access_log`: what the access log writes and how much it may buffer.

use super::{err, Result};
use crate::config::file::FileConfig;
use crate::config::AccessLogConfig;

pub(super) fn access_log(raw: &FileConfig) -> Result<AccessLogConfig> {
    let a = &raw.access_log;
    // NaN fails this too.
    if !(a.sample > 0.0 && a.sample <= 1.0) {
        return err(
            "access_log.sample",
            format!("{} must be greater than 0 and at most 1", a.sample),
        );
    }
    if !(1..=1 << 20).contains(&a.buffer) {
        return err("access_log.buffer", "must be between 1 and 1048576 lines");
    }
    Ok(AccessLogConfig {
        buffer: a.buffer,
        enabled: a.enabled,
        format: a.format,
        sample: a.sample,
        query: a.query,
        request_id: a.request_id,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::file;
    use crate::config::testing::{err, parse, APP};

    #[test]
    fn access_log_defaults_errors_and_reload() {
        let cfg = parse(APP).expect("valid");
        let a = cfg.access_log;
        assert!(!a.enabled && !a.query);
        assert_eq!(a.format, file::FileLogFormat::Text);
        assert_eq!(a.sample, 1.0);
        assert_eq!(a.request_id, file::FileRequestId::Pass);
        assert_eq!(a.buffer, 4096);

        let set = parse(&format!(
            "access_log: {{ enabled: true, format: json, sample: 0.25, query: true, \
             request_id: generate }}\n{APP}"
        ))
        .expect("valid");
        let a = set.access_log;
        assert!(a.enabled && a.query);
        assert_eq!(a.format, file::FileLogFormat::Json);
        assert_eq!(a.sample, 0.25);
        assert_eq!(a.request_id, file::FileRequestId::Generate);
        // All of it applies on reload, but the buffer's size.
        assert!(cfg.restart_only_changes(&set).is_empty());
        let bigger = parse(&format!("access_log: {{ buffer: 100 }}\n{APP}")).expect("valid");
        assert_eq!(cfg.restart_only_changes(&bigger), ["access_log.buffer"]);

        for (yaml, path) in [
            ("access_log: { sample: 0 }", "access_log.sample"),
            ("access_log: { sample: 1.5 }", "access_log.sample"),
            ("access_log: { sample: -1 }", "access_log.sample"),
            ("access_log: { format: xml }", "access_log.format"),
            ("access_log: { request_id: make }", "access_log.request_id"),
            ("access_log: { enable: true }", "access_log"),
            ("access_log: { buffer: 0 }", "access_log.buffer"),
        ] {
            let e = err(&format!("{yaml}\n{APP}"));
            assert!(e.contains(path), "{yaml}: {e}");
        }
    }
}
