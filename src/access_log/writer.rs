//! The one writer of the access log: a thread that takes lines from the
//! buffer, formats them, and writes them in batches (one `write` per batch
//! of up to [`BATCH`] lines). After a batch it pauses for [`PAUSE`] before
//! it waits again: under load, lines then gather in the buffer and the
//! thread wakes a few hundred times a second instead of once per request
//! (a sender only wakes a receiver that is blocked waiting). A quiet log is
//! written at once.
//!
//! A line carries its request's start as an [`Instant`]; the writer turns
//! it into wall-clock time with one pair of clock reads per batch
//! ([`Clock`]), so a request reads the clock twice (start, end), not three
//! times.

use super::{dropped, format, Line};
use crate::metrics::Metrics;
use prometheus::IntCounter;
use std::io::Write;
use std::sync::mpsc::Receiver;
use std::time::{Instant, SystemTime};

/// Lines formatted into one write at most.
const BATCH: usize = 256;
/// Pause after each batch; bounds the wakeups, and what a line waits.
const PAUSE: std::time::Duration = std::time::Duration::from_millis(2);

/// Starts the writer thread; it ends when every sender is gone.
pub fn spawn(
    rx: Receiver<Box<Line>>,
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
pub fn run(rx: Receiver<Box<Line>>, mut out: Box<dyn Write + Send>, failed: IntCounter) {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut failing = false;
    let mut formatter = format::Formatter::default();
    while let Ok(first) = rx.recv() {
        buf.clear();
        let clock = Clock::now();
        formatter.write_line(&first, clock.wall(first.start), &mut buf);
        drop(first);
        let mut lines = 1;
        while lines < BATCH {
            match rx.try_recv() {
                Ok(line) => {
                    formatter.write_line(&line, clock.wall(line.start), &mut buf);
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

/// The wall-clock time and the monotonic clock read together, to turn
/// a line's start (monotonic, read on the request's worker) into
/// wall-clock time. A line is at most a batch old, so a step of the wall
/// clock shifts only the lines written after it, as it would have.
pub struct Clock {
    wall: SystemTime,
    mono: Instant,
}

impl Clock {
    pub fn now() -> Clock {
        Clock {
            wall: SystemTime::now(),
            mono: Instant::now(),
        }
    }

    /// The wall-clock time of `at` (which is before now).
    pub fn wall(&self, at: Instant) -> SystemTime {
        let ago = self.mono.saturating_duration_since(at);
        self.wall.checked_sub(ago).unwrap_or(self.wall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access_log::{AccessLog, Text};
    use crate::config::file::FileLogFormat;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, UNIX_EPOCH};

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

    fn line(status: u16) -> Box<Line> {
        Box::new(Line {
            start: Instant::now(),
            peer: "127.0.0.1:1".parse().expect("addr"),
            method: http::Method::GET,
            format: FileLogFormat::Json,
            status,
            cache: None,
            route: None,
            duration: Duration::from_millis(1),
            upstream: None,
            bytes: 0,
            text: Text::new("/x", None, None),
        })
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

    #[test]
    fn a_line_gets_the_wall_clock_time_of_its_start() {
        let clock = Clock {
            wall: UNIX_EPOCH + Duration::from_secs(1000),
            mono: Instant::now(),
        };
        let started = clock
            .mono
            .checked_sub(Duration::from_millis(250))
            .expect("the monotonic clock is past 250 ms");
        assert_eq!(
            clock.wall(started),
            UNIX_EPOCH + Duration::from_millis(999_750)
        );
        // A start after the clock's reading (not expected): the reading.
        assert_eq!(clock.wall(clock.mono + Duration::from_secs(1)), clock.wall);
    }
}
