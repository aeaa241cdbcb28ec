//! `fill`: how many upstream fetches run at once, how long one may queue,
//! and the largest body a fill buffers to cache.

use super::{err, Result};
use crate::config::file::FileConfig;
use crate::config::FillConfig;
use std::time::Duration;

/// The largest `fill.max_body`: a cache entry stores its body length in 32
/// bits (`pipeline::entry`), so a longer body could not be written back
/// as it was read.
const MAX_BODY: u64 = u32::MAX as u64;

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
    if raw.fill.max_body.0 > MAX_BODY {
        return err(
            "fill.max_body",
            format!(
                "must be at most {MAX_BODY} bytes (4GiB - 1B): a cache entry stores the body \
                 length in 32 bits"
            ),
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

    #[test]
    fn max_body_fits_the_entry_format() {
        assert_eq!(parse(APP).expect("valid").fill.max_body, 1 << 20);
        let largest = parse(&format!("fill: {{ max_body: 4294967295 }}\n{APP}")).expect("valid");
        assert_eq!(largest.fill.max_body, u64::from(u32::MAX));
        for too_big in ["4294967296", "4GiB", "1000GiB"] {
            let e = err(&format!("fill: {{ max_body: {too_big} }}\n{APP}"));
            assert!(e.contains("fill.max_body"), "{too_big}: {e}");
            assert!(e.contains("at most 4294967295 bytes"), "{too_big}: {e}");
        }
    }
}
