//! Progress of long work (datagen, replay, sweep's trials): a bar redrawn in place when
//! stderr is a terminal, one line every `TRAINIO_PROGRESS_S` seconds (10 by default)
//! when it is not (a log, a pipe, mpirun's forwarding), nothing with `-q`.

use std::cell::{Cell, RefCell};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};

use crate::mlperf::datasize::human_bytes;

/// The environment variable that sets the interval of the progress lines, in seconds.
pub const INTERVAL_ENV: &str = "TRAINIO_PROGRESS_S";
const DEFAULT_INTERVAL_S: f64 = 10.0;

/// The interval between progress lines without a terminal: `TRAINIO_PROGRESS_S`, a number
/// of seconds in (0, 1e6], or 10 s. A bad value is an input error, checked before any work.
pub fn interval() -> Result<Duration> {
    let Some(raw) = std::env::var_os(INTERVAL_ENV) else {
        return Ok(Duration::from_secs_f64(DEFAULT_INTERVAL_S));
    };
    let text = raw.to_string_lossy();
    match text.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 1e6 => Ok(Duration::from_secs_f64(s)),
        _ => Err(crate::errors::InputError(format!(
            "{INTERVAL_ENV}={text}: not a number of seconds between 0 (excluded) and 1e6"
        ))
        .into()),
    }
}

/// What a progress count counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unit {
    Steps,
    Bytes,
}

enum Out {
    Off,
    Bar(ProgressBar),
    Lines { every: Duration, started: Instant, last: Cell<Instant> },
}

/// One piece of long work's progress: `total` units, advanced by [`Progress::inc`].
pub struct Progress {
    what: &'static str,
    unit: Unit,
    total: u64,
    done: Cell<u64>,
    note: RefCell<String>,
    out: Out,
}

impl Progress {
    /// Progress of `what` (the command's name, first in each line) over `total` units:
    /// nothing unless `show`, a bar on a terminal, else periodic lines.
    pub fn new(show: bool, what: &'static str, unit: Unit, total: u64) -> Self {
        let out = if !show {
            Out::Off
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(total);
            let template = match unit {
                Unit::Steps => format!("{what} {{bar:40}} step {{pos}}/{{len}} {{per_sec}} eta {{eta}} {{msg}}"),
                Unit::Bytes => format!(
                    "{what} {{bar:40}} {{binary_bytes}}/{{binary_total_bytes}} {{binary_bytes_per_sec}} eta {{eta}} {{msg}}"
                ),
            };
            bar.set_style(ProgressStyle::with_template(&template).expect("progress template"));
            Out::Bar(bar)
        } else {
            let now = Instant::now();
            let every = interval().unwrap_or(Duration::from_secs_f64(DEFAULT_INTERVAL_S));
            Out::Lines { every, started: now, last: Cell::new(now) }
        };
        Progress { what, unit, total, done: Cell::new(0), note: RefCell::default(), out }
    }

    /// Advances by `n` units.
    pub fn inc(&self, n: u64) {
        self.done.set(self.done.get() + n);
        match &self.out {
            Out::Off => {}
            Out::Bar(bar) => bar.inc(n),
            Out::Lines { every, started, last } => {
                let now = Instant::now();
                if now.duration_since(last.get()) >= *every {
                    last.set(now);
                    eprintln!("{}", self.line(now.duration_since(*started)));
                }
            }
        }
    }

    /// Whether anything is shown (a caller need not build a note otherwise).
    pub fn shown(&self) -> bool {
        !matches!(self.out, Out::Off)
    }

    /// A note shown after the counts (a replay's AU so far).
    pub fn set_note(&self, note: String) {
        if let Out::Bar(bar) = &self.out {
            bar.set_message(note.clone());
        }
        *self.note.borrow_mut() = note;
    }

    /// Removes the bar; lines need no ending.
    pub fn finish(&self) {
        if let Out::Bar(bar) = &self.out {
            bar.finish_and_clear();
        }
    }

    /// One progress line: "replay: step 120/400 (30%), 24.0 steps/s, eta 12 s, AU so far 97.1%".
    fn line(&self, elapsed: Duration) -> String {
        let (done, total) = (self.done.get(), self.total);
        let pct = if total > 0 { 100.0 * done as f64 / total as f64 } else { 0.0 };
        let secs = elapsed.as_secs_f64().max(1e-9);
        let rate = done as f64 / secs;
        let eta =
            if rate > 0.0 && total >= done { format!("{:.0} s", (total - done) as f64 / rate) } else { "?".into() };
        let counts = match self.unit {
            Unit::Steps => format!("step {done}/{total} ({pct:.0}%), {rate:.1} steps/s"),
            Unit::Bytes => format!(
                "{}/{} ({pct:.0}%), {}/s",
                human_bytes(done as f64),
                human_bytes(total as f64),
                human_bytes(rate)
            ),
        };
        let note = self.note.borrow();
        if note.is_empty() {
            format!("{}: {counts}, eta {eta}", self.what)
        } else {
            format!("{}: {counts}, eta {eta}, {note}", self.what)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(unit: Unit, total: u64) -> Progress {
        let now = Instant::now();
        let out = Out::Lines { every: Duration::from_secs(3600), started: now, last: Cell::new(now) };
        Progress { what: "replay", unit, total, done: Cell::new(0), note: RefCell::default(), out }
    }

    #[test]
    fn a_line_gives_the_counts_the_rate_the_eta_and_the_note() {
        let p = lines(Unit::Steps, 400);
        p.inc(100);
        p.set_note("AU so far 97.1%".into());
        assert_eq!(
            p.line(Duration::from_secs(10)),
            "replay: step 100/400 (25%), 10.0 steps/s, eta 30 s, AU so far 97.1%"
        );
        let b = lines(Unit::Bytes, 3 << 30);
        b.inc(1 << 30);
        assert_eq!(b.line(Duration::from_secs(2)), "replay: 1.0 GiB/3.0 GiB (33%), 512.0 MiB/s, eta 4 s");
    }

    #[test]
    fn nothing_done_yet_has_no_eta() {
        assert_eq!(lines(Unit::Steps, 10).line(Duration::from_secs(1)), "replay: step 0/10 (0%), 0.0 steps/s, eta ?");
    }

    #[test]
    fn the_interval_is_checked() {
        // One test owns the variable: tests run in threads of one process.
        for (raw, ok) in
            [("0.5", Some(0.5)), ("0", None), ("-1", None), ("nan", None), ("inf", None), ("1e300", None), ("x", None)]
        {
            std::env::set_var(INTERVAL_ENV, raw);
            let got = interval();
            match ok {
                Some(s) => assert_eq!(got.unwrap(), Duration::from_secs_f64(s)),
                None => assert!(got.unwrap_err().to_string().contains(INTERVAL_ENV), "{raw}"),
            }
        }
        std::env::remove_var(INTERVAL_ENV);
        assert_eq!(interval().unwrap(), Duration::from_secs(10));
    }
}
