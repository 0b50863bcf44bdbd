//! `--record DIR`: trace the replay itself with `trainio record --pid <own pid>`, in the
//! same run, so the replay's I/O can be compared with the recording it came from.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub struct Recorder {
    child: Child,
    output: PathBuf,
}

/// bin/trainio of the checkout this binary was built in (target/release/../../bin/trainio),
/// else `trainio` on PATH.
fn trainio_entry() -> PathBuf {
    if let Some(root) = std::env::current_exe()
        .ok()
        .and_then(|e| e.ancestors().nth(3).map(Path::to_path_buf))
    {
        let entry = root.join("bin/trainio");
        if entry.exists() {
            return entry;
        }
    }
    PathBuf::from("trainio")
}

impl Recorder {
    pub fn start(output: &Path) -> Result<Recorder> {
        let entry = trainio_entry();
        let child = Command::new(&entry)
            .arg("record")
            .arg("--output")
            .arg(output)
            .arg("--pid")
            .arg(std::process::id().to_string())
            .spawn()
            .with_context(|| format!("--record: starting {} record", entry.display()))?;
        let mut r = Recorder {
            child,
            output: output.to_path_buf(),
        };
        // The recorder attaches its probes before it creates the output directory; give it
        // up to 10 s, and fail if it exits instead.
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Some(status) = r.child.try_wait()? {
                bail!("--record: the recorder exited before the replay started ({status})");
            }
            if r.output.exists() {
                std::thread::sleep(Duration::from_millis(200));
                return Ok(r);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(r)
    }

    /// Stops the recorder with SIGINT (it closes its last segment) and waits for it.
    pub fn stop(mut self) -> Result<()> {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self
            .child
            .wait()
            .context("--record: waiting for the recorder")?;
        if !status.success() {
            bail!(
                "--record: the recorder failed ({status}); its output is in {}",
                self.output.display()
            );
        }
        eprintln!(
            "trainio replay: recorded the replay's I/O into {}",
            self.output.display()
        );
        Ok(())
    }
}
