//! The one writer of the access log: a thread that takes the formatted
//! lines out of every shard (a swap of buffers under the shard's lock, so
//! no request waits for more than that) and writes each shard's lines with
//! one `write`. After a pass that found lines it pauses for [`PAUSE`]:
//! under load, lines then gather in the shards and the thread wakes a few
//! hundred times a second, not once per request. A pass that finds none
//! parks the thread until a request's line wakes it, so a quiet log is
//! written at once and an idle one costs no wakeups.
//!
//! A line carries its request's start as an [`Instant`]; its shard's
//! [`Clock`] turns that into wall-clock time, so a request reads the clock
//! twice (start, end), not three times.

use super::{dropped, AccessLog};
use crate::metrics::Metrics;
use prometheus::IntCounter;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Pause after each pass that wrote; bounds the wakeups, and what a line
/// waits.
const PAUSE: Duration = Duration::from_millis(2);

/// How long a shard's [`Clock`] pairs its readings before reading the
/// wall clock again: a step of the wall clock shows in the log within it.
const CLOCK_REFRESH: Duration = Duration::from_secs(1);

/// Starts the writer thread (for the life of the process).
pub(crate) fn spawn(
    log: &Arc<AccessLog>,
    out: Box<dyn Write + Send>,
    metrics: &Metrics,
) -> std::io::Result<()> {
    let failed = metrics
        .access_log_dropped
        .with_label_values(&[dropped::WRITE_ERROR]);
    let log = Arc::clone(log);
    std::thread::Builder::new()
        .name("access-log".to_owned())
        .spawn(move || run(&log, out, failed))?;
    Ok(())
}

/// Writes forever: a pass over the shards, then a pause if it wrote, or
/// sleep until a line comes.
fn run(log: &AccessLog, mut out: Box<dyn Write + Send>, failed: IntCounter) {
    // Before the first pass: a line submitted before this finds no thread
    // to wake, and the first pass writes it.
    let _ = log.writer.get_or_init(std::thread::current);
    let mut writer = Writer::new(log, failed);
    loop {
        if writer.pass(&mut out) {
            std::thread::sleep(PAUSE);
            continue;
        }
        // Idle first, then look again: a line submitted after that look
        // sees the flag (the shard's lock orders the two) and wakes us.
        log.writer_idle.store(true, Ordering::SeqCst);
        if !writer.pass(&mut out) {
            std::thread::park();
        }
        log.writer_idle.store(false, Ordering::Relaxed);
    }
}

/// The writer's side of the shards: a spare buffer per shard to swap in,
/// and whether writes fail.
pub(crate) struct Writer<'a> {
    log: &'a AccessLog,
    spares: Vec<Vec<u8>>,
    failed: IntCounter,
    failing: bool,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(log: &'a AccessLog, failed: IntCounter) -> Writer<'a> {
        let spares = (0..log.shards())
            .map(|_| Vec::with_capacity(log.room()))
            .collect();
        Writer {
            log,
            spares,
            failed,
            failing: false,
        }
    }

    /// Takes every shard's lines and writes them; whether there were any.
    /// A failed write drops its lines (counted) and is logged once until a
    /// write succeeds again.
    pub(crate) fn pass(&mut self, out: &mut dyn Write) -> bool {
        let mut any = false;
        for (i, spare) in self.spares.iter_mut().enumerate() {
            let lines = self.log.take(i, spare);
            if lines == 0 {
                continue;
            }
            any = true;
            match out.write_all(spare).and_then(|()| out.flush()) {
                Ok(()) if self.failing => {
                    self.failing = false;
                    tracing::info!("access log writes succeed again");
                }
                Ok(()) => {}
                Err(e) => {
                    self.failed.inc_by(lines);
                    if !self.failing {
                        self.failing = true;
                        tracing::warn!(error = %e, "access log write failed; lines dropped");
                    }
                }
            }
            spare.clear();
        }
        any
    }
}

/// The wall-clock time and the monotonic clock read together, to turn a
/// line's start (monotonic, read on the request's thread) into wall-clock
/// time: read again when a line ends more than [`CLOCK_REFRESH`] after
/// the last reading, so a line costs no reading of its own.
#[derive(Default)]
pub(crate) struct Clock {
    /// Since the Unix epoch, at `mono`.
    wall: Duration,
    mono: Option<Instant>,
}

impl Clock {
    /// A line's start as wall-clock time (since the Unix epoch), and its
    /// duration: from its monotonic start and end.
    pub(crate) fn start_and_duration(
        &mut self,
        start: Instant,
        end: Instant,
    ) -> (Duration, Duration) {
        let duration = end.saturating_duration_since(start);
        let since = match self.mono.and_then(|mono| end.checked_duration_since(mono)) {
            Some(since) if since < CLOCK_REFRESH => since,
            _ => {
                self.wall = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                self.mono = Some(end);
                Duration::ZERO
            }
        };
        ((self.wall + since).saturating_sub(duration), duration)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access_log::{Line, Text};
    use crate::config::file::FileLogFormat;
    use std::sync::Mutex;

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
            start: Instant::now(),
            peer: "127.0.0.1:1".parse().expect("addr"),
            method: http::Method::GET,
            format: FileLogFormat::Json,
            status,
            cache: None,
            route: None,
            duration: Duration::ZERO,
            upstream: None,
            bytes: 0,
            text: Text::new("/x", None, None),
        }
    }

    #[test]
    fn writes_every_line_in_order_and_counts_failed_writes() {
        let metrics = Metrics::new();
        let failed = metrics
            .access_log_dropped
            .with_label_values(&[dropped::WRITE_ERROR]);
        let log = AccessLog::new(1, 64 * 1024, &metrics);
        for status in 200..300 {
            log.submit(&mut line(status), Instant::now());
        }
        let sink = Sink::default();
        let mut writer = Writer::new(&log, failed.clone());
        assert!(writer.pass(&mut sink.clone()));
        assert!(!writer.pass(&mut sink.clone()), "nothing left");
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

        for status in 200..210 {
            log.submit(&mut line(status), Instant::now());
        }
        assert!(writer.pass(&mut Sink(Arc::default(), true)));
        assert_eq!(failed.get(), 10);
    }

    #[test]
    fn a_line_gets_the_wall_clock_time_of_its_start() {
        let mono = Instant::now();
        let mut clock = Clock {
            wall: Duration::from_secs(1000),
            mono: Some(mono),
        };
        let at = |ms| mono + Duration::from_millis(ms);
        // Ended 300 ms after the reading, took 200 ms.
        assert_eq!(
            clock.start_and_duration(at(100), at(300)),
            (Duration::from_millis(1_000_100), Duration::from_millis(200))
        );
        // Started before the reading.
        assert_eq!(
            clock.start_and_duration(mono, at(10)),
            (Duration::from_secs(1000), Duration::from_millis(10))
        );
        // A reading older than CLOCK_REFRESH is taken again, from the wall
        // clock (not 1000 s plus the monotonic time).
        let end = mono + CLOCK_REFRESH + Duration::from_millis(1);
        let (start, took) = clock.start_and_duration(end, end);
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970");
        assert!(
            now.abs_diff(start) < Duration::from_secs(5),
            "{start:?} vs {now:?}"
        );
        assert_eq!((took, clock.mono), (Duration::ZERO, Some(end)));
    }
}
