//! Result files (`--json`): checked before the run, written atomically after it, and
//! never lost: when the file cannot be written, the results go to standard output.
use std::ffi::CString;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};

use crate::replay::InputError;

/// Refuses, before any work, a result path that could not be written at the end: its
/// directory missing, not a directory, or not writable (a read-only mount), or the path
/// itself something other than a regular file (a directory, a device, a FIFO, a
/// symlink: the atomic rename would replace the link or the node rather than write
/// through it).
pub fn check(path: &Path, option: &str) -> Result<()> {
    let bad = |why: String| anyhow!(InputError(format!("{option} {}: {why}", path.display())));
    if let Ok(m) = fs::symlink_metadata(path) {
        if m.file_type().is_symlink() {
            return Err(bad("is a symbolic link: give the file it points to".into()));
        }
        if !m.is_file() {
            return Err(bad("exists and is not a regular file".into()));
        }
    }
    let dir = parent(path);
    match fs::metadata(&dir) {
        Err(e) => return Err(bad(format!("directory {} is missing ({e})", dir.display()))),
        Ok(m) if !m.is_dir() => return Err(bad(format!("{} is not a directory", dir.display()))),
        Ok(_) => {}
    }
    let c = CString::new(dir.as_os_str().as_bytes()).map_err(|_| bad("contains a NUL byte".into()))?;
    // SAFETY: c is a NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
        return Err(bad(format!("directory {} is not writable: {}", dir.display(), std::io::Error::last_os_error())));
    }
    Ok(())
}

/// Where `path` is, links resolved: the file itself when it exists, else its resolved
/// directory joined with its name (None when the directory cannot be resolved).
fn resolved(path: &Path) -> Option<PathBuf> {
    fs::canonicalize(path).ok().or_else(|| Some(fs::canonicalize(parent(path)).ok()?.join(path.file_name()?)))
}

/// Refuses an output `path` that is one of the command's `inputs` (the same file: the
/// same (st_dev, st_ino), whether named directly, through a symbolic link or a hard
/// link), or lies inside one of its input directories (`inside`, each named with what it
/// is: "the trace", "--data-dir"). A data directory's top level may hold results files
/// (`sweep` saves its curve there): only `.trainio-*` entries and subdirectories (the
/// dataset and the checkpoints) are refused there.
pub fn refuse_inputs(path: &Path, option: &str, inputs: &[(&str, &Path)], inside: &[(&str, &Path)]) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let bad = |why: String| anyhow!(InputError(format!("{option} {}: {why}", path.display())));
    if let Ok(out) = fs::metadata(path) {
        for (what, input) in inputs {
            if let Ok(m) = fs::metadata(input) {
                if (m.dev(), m.ino()) == (out.dev(), out.ino()) {
                    return Err(bad(format!(
                        "is {what} {} (the same file): the output would replace the command's own input",
                        input.display()
                    )));
                }
            }
        }
    }
    // A hard link to a file inside one of the directories (rare: only then is it walked).
    if let Some(out) = fs::metadata(path).ok().filter(|m| m.is_file() && m.nlink() > 1) {
        for (what, dir) in inside {
            if let Some(twin) = same_inode_under(dir, (out.dev(), out.ino())) {
                return Err(bad(format!(
                    "is {} inside {what} {} (a hard link): the output would replace it",
                    twin.display(),
                    dir.display()
                )));
            }
        }
    }
    let Some(out) = resolved(path) else { return Ok(()) };
    for (what, dir) in inside {
        let Ok(dir_real) = fs::canonicalize(dir) else { continue };
        let Ok(rel) = out.strip_prefix(&dir_real) else { continue };
        let top_level_results =
            *what == "--data-dir" && rel.components().count() == 1 && !rel.to_string_lossy().starts_with(".trainio-");
        if !top_level_results {
            return Err(bad(format!(
                "is inside {what} {}: the output would overwrite the command's own input",
                dir.display()
            )));
        }
    }
    Ok(())
}

/// A file under `dir` (links not followed) whose (st_dev, st_ino) is `id`.
fn same_inode_under(dir: &Path, id: (u64, u64)) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                todo.push(e.path());
            } else if (m.dev(), m.ino()) == id {
                return Some(e.path());
            }
        }
    }
    None
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory, renamed into
/// place: a reader sees the old file or the whole new one, and a full disk
/// leaves no truncated file behind.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path.file_name().ok_or_else(|| anyhow!("{}: not a file name", path.display()))?;
    let tmp = parent(path).join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let written = (|| -> Result<()> {
        let mut f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes).with_context(|| format!("writing {}", tmp.display()))?;
        // No fsync: a recorded replay's own results file must not put a sync (a journal
        // commit on the data's file system) into the trace it records.
        fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// Saves a run's results as JSON. If the file cannot be written (checked before the run,
/// so only a fault since, such as a full disk), the results are printed on standard
/// output instead and the error says so: the run is never lost.
pub fn save_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value)?;
    if let Err(e) = write_atomic(path, &bytes) {
        println!("{}", String::from_utf8_lossy(&bytes));
        return Err(
            e.context(format!("the results could not be saved to {} and are printed above instead", path.display()))
        );
    }
    Ok(())
}
