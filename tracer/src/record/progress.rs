//! The recorder's progress while it runs: a status line redrawn in place when stderr is a
//! terminal that no traced command shares, otherwise one line every `TRAINIO_PROGRESS_S`
//! seconds (10 by default; the same variable as replay's), nothing with `-q`. A line:
//! `record: 30 s, 3712400 events (123.7 k/s), read 1204.2 MiB, wrote 12.0 MiB, 3 segments, lost 0`.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::events::Collector;

/// The environment variable that sets the interval of the progress lines, in seconds.
const INTERVAL_ENV: &str = "TRAINIO_PROGRESS_S";
const DEFAULT_INTERVAL_S: f64 = 10.0;
/// How often the status line on a terminal is redrawn.
const REDRAW: Duration = Duration::from_secs(1);

/// The interval between progress lines: `TRAINIO_PROGRESS_S`, a number of seconds in
/// (0, 1e6], or 10 s. Err holds the one-line message for a bad value.
pub(super) fn interval() -> Result<Duration, String> {
    let Some(raw) = std::env::var_os(INTERVAL_ENV) else {
        return Ok(Duration::from_secs_f64(DEFAULT_INTERVAL_S));
    };
    let text = raw.to_string_lossy();
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 1e6 => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!("{INTERVAL_ENV}={text}: not a number of seconds between 0 (excluded) and 1e6")),
    }
}

/// Where the progress goes.
#[derive(Debug, PartialEq)]
enum Out {
    Off,
    /// One line redrawn in place (`\r`), cleared at the end.
    Status,
    /// A line every interval.
    Lines(Duration),
}

/// What the recording has done so far, as a progress line shows it.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Sofar {
    pub events: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub segments: u64,
    pub lost: u64,
}

impl Sofar {
    /// The collector's events and bytes over every layer, with the segments closed and
    /// the events lost.
    pub(super) fn of(coll: &Collector, segments: u64, lost: u64) -> Sofar {
        let mut s = Sofar { segments, lost, ..Sofar::default() };
        for t in coll.tally().values() {
            s.events += t.events;
            s.bytes_read += t.bytes_read;
            s.bytes_written += t.bytes_written;
        }
        s
    }
}

/// The recording's progress: [`Progress::due`] says when a line is wanted,
/// [`Progress::show`] prints it.
pub(super) struct Progress {
    out: Out,
    started: Instant,
    last: Instant,
    last_events: u64,
    drawn: usize,
}

impl Progress {
    /// Nothing when `quiet`; a status line on a terminal when no traced `command` writes
    /// to it too; else lines every `every`.
    pub(super) fn new(quiet: bool, command: bool, every: Duration, started: Instant) -> Progress {
        let out = match (quiet, std::io::stderr().is_terminal() && !command) {
            (true, _) => Out::Off,
            (false, true) => Out::Status,
            (false, false) => Out::Lines(every),
        };
        Progress { out, started, last: started, last_events: 0, drawn: 0 }
    }

    /// Whether a line is due at `now`.
    pub(super) fn due(&self, now: Instant) -> bool {
        match self.out {
            Out::Off => false,
            Out::Status => now - self.last >= REDRAW,
            Out::Lines(every) => now - self.last >= every,
        }
    }

    /// Prints the line for `sofar` at `now`.
    pub(super) fn show(&mut self, now: Instant, sofar: Sofar) {
        let since = (now - self.last).as_secs_f64();
        let rate = if since > 0.0 { sofar.events.saturating_sub(self.last_events) as f64 / since } else { 0.0 };
        let text = line(now - self.started, sofar, rate);
        let mut err = std::io::stderr().lock();
        // A progress line that cannot be written is not worth stopping the recording for.
        let _ = match self.out {
            Out::Off => Ok(()),
            Out::Status => {
                let pad = self.drawn.saturating_sub(text.len());
                self.drawn = text.len();
                write!(err, "\r{text}{:pad$}", "").and_then(|_| err.flush())
            }
            Out::Lines(_) => writeln!(err, "{text}"),
        };
        self.last = now;
        self.last_events = sofar.events;
    }

    /// Clears the status line, so that the summary starts on a clean line.
    pub(super) fn finish(&mut self) {
        if self.out == Out::Status && self.drawn > 0 {
            let _ = write!(std::io::stderr().lock(), "\r{:w$}\r", "", w = self.drawn);
            self.drawn = 0;
        }
    }
}

/// One progress line: elapsed seconds, events and their rate since the last line, the
/// bytes the traced I/O read and wrote, segments closed and events lost.
fn line(elapsed: Duration, s: Sofar, rate: f64) -> String {
    let mib = |b: u64| b as f64 / 1048576.0;
    let rate = if rate >= 1e6 {
        format!("{:.1} M/s", rate / 1e6)
    } else if rate >= 1e3 {
        format!("{:.1} k/s", rate / 1e3)
    } else {
        format!("{rate:.0}/s")
    };
    format!(
        "record: {:.0} s, {} events ({rate}), read {:.1} MiB, wrote {:.1} MiB, {} segment{}, lost {}",
        elapsed.as_secs_f64(),
        s.events,
        mib(s.bytes_read),
        mib(s.bytes_written),
        s.segments,
        if s.segments == 1 { "" } else { "s" },
        s.lost
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_says_time_events_rate_bytes_segments_and_losses() {
        let s = Sofar { events: 3_712_400, bytes_read: 3 << 29, bytes_written: 12 << 20, segments: 1, lost: 7 };
        assert_eq!(
            line(Duration::from_secs(30), s, 123_700.0),
            "record: 30 s, 3712400 events (123.7 k/s), read 1536.0 MiB, wrote 12.0 MiB, 1 segment, lost 7"
        );
        let s = Sofar { segments: 2, ..s };
        assert!(
            line(Duration::ZERO, s, 2.5e6).contains("(2.5 M/s)")
                && line(Duration::ZERO, s, 2.5e6).contains("2 segments")
        );
        assert!(line(Duration::ZERO, s, 12.0).contains("(12/s)"));
    }

    #[test]
    fn lines_come_at_the_interval_and_not_at_all_when_quiet() {
        let t0 = Instant::now();
        let p = Progress::new(false, true, Duration::from_secs(5), t0);
        assert_eq!(p.out, Out::Lines(Duration::from_secs(5)), "a command shares the terminal: lines");
        assert!(!p.due(t0 + Duration::from_secs(4)) && p.due(t0 + Duration::from_secs(5)));
        let q = Progress::new(true, false, Duration::from_secs(5), t0);
        assert!(!q.due(t0 + Duration::from_secs(3600)));
    }
}
