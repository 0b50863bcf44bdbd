//! `--record DIR`: trace the replay itself with `trainio record --pid <own pid>`, in the
//! same run, so the replay's I/O can be compared with the recording it came from.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::replay::InputError;

pub struct Recorder {
    child: Child,
    output: PathBuf,
}

/// The environment variable that names the recorder program `--record` runs.
pub const RECORD_ENV: &str = "TRAINIO_RECORD";
/// The recorder's file name, as `make` builds it into target/release.
const RECORDER: &str = "trainio-record";

/// The recorder `--record` runs, found one way (docs/replay.md, *--record*): the program
/// `TRAINIO_RECORD` names when it is set, else `trainio-record` next to this executable
/// (target/release in a checkout, where `make` builds both), else `trainio-record` on PATH.
pub fn find_recorder() -> Result<PathBuf> {
    locate_recorder(std::env::var_os(RECORD_ENV), std::env::current_exe().ok(), std::env::var_os("PATH"))
}

fn locate_recorder(env: Option<OsString>, exe: Option<PathBuf>, path: Option<OsString>) -> Result<PathBuf> {
    if let Some(given) = env.filter(|v| !v.is_empty()) {
        let given = PathBuf::from(given);
        if !is_executable(&given) {
            bail!(InputError(format!("--record: {RECORD_ENV}={}: not an executable file", given.display())));
        }
        return Ok(given);
    }
    let sibling = exe.as_deref().and_then(Path::parent).map(|dir| dir.join(RECORDER));
    if let Some(sibling) = sibling.filter(|p| is_executable(p)) {
        return Ok(sibling);
    }
    if let Some(found) =
        path.iter().flat_map(std::env::split_paths).map(|dir| dir.join(RECORDER)).find(|p| is_executable(p))
    {
        return Ok(found);
    }
    let beside =
        exe.as_deref().and_then(Path::parent).map_or_else(|| "this program".into(), |d| d.display().to_string());
    bail!(InputError(format!(
        "--record: no {RECORDER} in {beside} nor on PATH: run 'make', or set {RECORD_ENV} to the recorder"
    )))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

impl Recorder {
    /// Starts `program` (the recorder [`find_recorder`] found) on this process and waits
    /// until it records.
    pub fn start(program: &Path, output: &Path) -> Result<Recorder> {
        let mut child = Command::new(program)
            .arg("--output")
            .arg(output)
            .arg("--pid")
            .arg(std::process::id().to_string())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("--record: starting {}", program.display()))?;
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

/// The file in a `--record` trace directory that holds the recorded replay's results
/// (traces/SCHEMA.md, where it says what a trace directory holds).
pub const RESULTS_FILE: &str = "replay.json";

/// Saves the replay's results (the --json object) into the trace it recorded of itself.
pub fn save_results(dir: &Path, summary: &serde_json::Value) -> Result<()> {
    let path = dir.join(RESULTS_FILE);
    crate::output::write_atomic(&path, &serde_json::to_vec_pretty(summary)?).with_context(|| {
        format!("--record: saving the replay's results to {} (the results above stand)", path.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh directory under the system's temporary directory, removed on drop.
    struct Dir(PathBuf);
    impl Dir {
        fn new(name: &str) -> Dir {
            let d = std::env::temp_dir().join(format!("trainio-locate-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Dir(d)
        }
        fn file(&self, rel: &str, mode: u32) -> PathBuf {
            let p = self.0.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn input_error(r: Result<PathBuf>) -> String {
        let e = r.expect_err("refused");
        assert!(e.downcast_ref::<InputError>().is_some(), "an input error (exit 2): {e:#}");
        format!("{e:#}")
    }

    #[test]
    fn the_environment_variable_comes_first() {
        let d = Dir::new("env");
        let exe = d.file("release/trainio-replay", 0o755);
        d.file("release/trainio-record", 0o755);
        let chosen = d.file("elsewhere/my-recorder", 0o700);
        let path = Some(d.0.join("release").into_os_string());
        assert_eq!(locate_recorder(Some(chosen.clone().into()), Some(exe), path).unwrap(), chosen);
    }

    #[test]
    fn a_bad_environment_variable_is_refused_not_passed_over() {
        let d = Dir::new("badenv");
        let exe = d.file("release/trainio-replay", 0o755);
        d.file("release/trainio-record", 0o755);
        let plain = d.file("plain-file", 0o644);
        for bad in [plain, d.0.join("absent"), d.0.clone()] {
            let msg = input_error(locate_recorder(Some(bad.clone().into()), Some(exe.clone()), None));
            assert_eq!(msg, format!("--record: TRAINIO_RECORD={}: not an executable file", bad.display()));
        }
    }

    #[test]
    fn next_to_the_executable_then_on_path() {
        let d = Dir::new("sibling");
        let exe = d.file("release/trainio-replay", 0o755);
        let on_path = d.file("bin/trainio-record", 0o755);
        let path = std::env::join_paths([d.0.join("nowhere"), d.0.join("bin")]).unwrap();
        // nothing beside the executable: PATH's
        assert_eq!(locate_recorder(None, Some(exe.clone()), Some(path.clone())).unwrap(), on_path);
        // an empty TRAINIO_RECORD counts as unset
        assert_eq!(locate_recorder(Some("".into()), Some(exe.clone()), Some(path.clone())).unwrap(), on_path);
        // a recorder that is not executable beside it is passed over
        d.file("release/trainio-record", 0o644);
        assert_eq!(locate_recorder(None, Some(exe.clone()), Some(path.clone())).unwrap(), on_path);
        let sibling = d.file("release/trainio-record", 0o755);
        assert_eq!(locate_recorder(None, Some(exe), Some(path)).unwrap(), sibling);
    }

    #[test]
    fn none_found_says_where_it_looked() {
        let d = Dir::new("none");
        let exe = d.file("release/trainio-replay", 0o755);
        let msg = input_error(locate_recorder(None, Some(exe), Some(d.0.join("bin").into_os_string())));
        assert_eq!(
            msg,
            format!(
                "--record: no trainio-record in {} nor on PATH: run 'make', or set TRAINIO_RECORD to the recorder",
                d.0.join("release").display()
            )
        );
    }
}
