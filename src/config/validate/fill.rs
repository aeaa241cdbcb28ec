//! `fill`: how many upstream fetches run at once and how long one may queue.

use super::{err, Result};
use crate::config::file::FileConfig;
use crate::config::FillConfig;
use std::time::Duration;

pub(super) fn fill(raw: &FileConfig) -> Result<FillConfig> {
    if raw.fill.max_concurrency == 0 {
        return err("fill.max_concurrency", "must be at least 1");
    }
    if raw.fill.queue_timeout.0 > Duration::from_secs(10) {
        return err(
            "fill.queue_timeout",
            "must be at most 10s: a queued fill holds its client, and a long queue hides an overload",
        );
    }
    Ok(FillConfig {
        max_concurrency: raw.fill.max_concurrency,
        max_body: raw.fill.max_body.0,
        queue_timeout: raw.fill.queue_timeout.0,
        max_queued: raw.fill.max_queued,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::testing::{err, parse, APP};
    use std::time::Duration;

    #[test]
    fn fill_queue_defaults_and_bounds() {
        let cfg = parse(APP).expect("valid");
        assert_eq!(cfg.fill.queue_timeout, Duration::from_millis(250));
        assert_eq!(cfg.fill.max_queued, 256);
        let cfg = parse(&format!(
            "fill: {{ queue_timeout: 0s, max_queued: 3 }}\n{APP}"
        ))
        .expect("valid");
        assert_eq!(cfg.fill.queue_timeout, Duration::ZERO);
        assert_eq!(cfg.fill.max_queued, 3);
        let e = err(&format!("fill: {{ queue_timeout: 11s }}\n{APP}"));
        assert!(e.contains("fill.queue_timeout"), "{e}");
        let e = err(&format!("fill: {{ queue_timeout: -1s }}\n{APP}"));
        assert!(e.contains("fill.queue_timeout"), "{e}");
    }
}
