//! The one writer of the access log: a thread that takes lines from the
//! buffer, formats them, and writes them in batches (one `write` per batch
//! of up to [`BATCH`] lines). After a batch it pauses for [`PAUSE`] before
//! it waits again: under load, lines then gather in the buffer and the
//! thread wakes a few hundred times a second instead of once per request
//! (a sender only wakes a receiver that is blocked waiting). A quiet log is
//! written at once.

use super::{dropped, format, Line};
use crate::metrics::Metrics;
use prometheus::IntCounter;
use std::io::Write;
use std::sync::mpsc::Receiver;

/// Lines formatted into one write at most.
const BATCH: usize = 256;
/// Pause after each batch; bounds the wakeups, and what a line waits.
const PAUSE: std::time::Duration = std::time::Duration::from_millis(2);

/// Starts the writer thread; it ends when every sender is gone.
pub fn spawn(
    rx: Receiver<Line>,
    out: Box<dyn Write + Send>,
    metrics: &Metrics,
) -> std::io::Result<()> {
    let failed = metrics
        .access_log_dropped
        .with_label_values(&[dropped::WRITE_ERROR]);
    std::thread::Builder::new()
        .name("access-log".to_owned())
        .spawn(move || run(rx, out, failed))?;
    Ok(())
}

/// Writes until the channel closes. A failed write drops its batch
/// (counted) and is logged once until a write succeeds again.
pub fn run(rx: Receiver<Line>, mut out: Box<dyn Write + Send>, failed: IntCounter) {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut failing = false;
    let mut formatter = format::Formatter::default();
    while let Ok(first) = rx.recv() {
        buf.clear();
        formatter.write_line(&first, &mut buf);
        let mut lines = 1;
        while lines < BATCH {
            match rx.try_recv() {
                Ok(line) => {
                    formatter.write_line(&line, &mut buf);
                    lines += 1;
                }
                Err(_) => break,
            }
        }
        match out.write_all(&buf).and_then(|()| out.flush()) {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("access log writes succeed again");
            }
            Ok(()) => {}
            Err(e) => {
                failed.inc_by(lines as u64);
                if !failing {
                    failing = true;
                    tracing::warn!(error = %e, "access log write failed; lines dropped");
                }
            }
        }
        if lines < BATCH {
            std::thread::sleep(PAUSE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access_log::AccessLog;
    use crate::config::file::FileLogFormat;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, SystemTime};

    /// A `Write` that keeps what it gets, or fails every write.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>, bool);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.1 {
                return Err(std::io::Error::other("disk full"));
            }
            self.0.lock().expect("sink").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn line(status: u16) -> Line {
        Line {
            time: SystemTime::now(),
            peer: "127.0.0.1:1".parse().expect("addr"),
            method: http::Method::GET,
            path: "/x".into(),
            query: None,
            format: FileLogFormat::Json,
            status,
            cache: None,
            route: None,
            duration: Duration::from_millis(1),
            upstream: None,
            bytes: 0,
            trace_id: None,
            request_id: None,
        }
    }

    #[test]
    fn writes_every_line_in_order_and_counts_failed_writes() {
        let metrics = Metrics::new();
        let (log, rx) = AccessLog::new(1000, &metrics);
        for status in 200..300 {
            log.submit(line(status));
        }
        drop(log);
        let sink = Sink::default();
        let failed = metrics
            .access_log_dropped
            .with_label_values(&[dropped::WRITE_ERROR]);
        run(rx, Box::new(sink.clone()), failed.clone());
        let text = String::from_utf8(sink.0.lock().expect("sink").clone()).expect("utf-8");
        let statuses: Vec<u64> = text
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("json line");
                v["status"].as_u64().expect("status")
            })
            .collect();
        assert_eq!(statuses, (200..300).collect::<Vec<u64>>());
        assert_eq!(failed.get(), 0);

        let (log, rx) = AccessLog::new(1000, &metrics);
        for status in 200..210 {
            log.submit(line(status));
        }
        drop(log);
        run(rx, Box::new(Sink(Arc::default(), true)), failed.clone());
        assert_eq!(failed.get(), 10);
    }
}
