//! `--record DIR`: trace the replay itself with `trainio record --pid <own pid>`, in the
//! same run, so the replay's I/O can be compared with the recording it came from.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub struct Recorder {
    child: Child,
    output: PathBuf,
}

/// bin/trainio of the checkout this binary was built in (target/release/../../bin/trainio),
/// else `trainio` on PATH.
fn trainio_entry() -> PathBuf {
    if let Some(root) = std::env::current_exe().ok().and_then(|e| e.ancestors().nth(3).map(Path::to_path_buf)) {
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
        let mut child = Command::new(&entry)
            .arg("record")
            .arg("--output")
            .arg(output)
            .arg("--pid")
            .arg(std::process::id().to_string())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("--record: starting {} record", entry.display()))?;
        // The recorder says "recording LAYERS into DIR" once its probes are attached and
        // it follows our pid (it creates DIR before loading the probes, which can take
        // seconds on a busy host: DIR existing is no sign). Its stderr is passed on.
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        let stderr = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            let mut ready = Some(ready_tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
                if line.starts_with("trainio record: recording ") {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                }
            }
        });
        let mut r = Recorder { child, output: output.to_path_buf() };
        let started = Instant::now();
        loop {
            match ready_rx.recv_timeout(Duration::from_millis(50)) {
                Ok(()) => return Ok(r),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = r.child.wait()?;
                    bail!("--record: the recorder exited before the replay started ({status})");
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            if let Some(status) = r.child.try_wait()? {
                bail!("--record: the recorder exited before the replay started ({status})");
            }
            if started.elapsed() > Duration::from_secs(120) {
                let _ = r.child.kill();
                let _ = r.child.wait();
                bail!("--record: the recorder did not start recording within 120 s");
            }
        }
    }

    /// Stops the recorder with SIGINT (it closes its last segment) and waits for it.
    pub fn stop(mut self) -> Result<()> {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().context("--record: waiting for the recorder")?;
        if !status.success() {
            bail!("--record: the recorder failed ({status}); its output is in {}", self.output.display());
        }
        eprintln!("trainio replay: recorded the replay's I/O into {}", self.output.display());
        Ok(())
    }
}
