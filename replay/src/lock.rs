//! One run per data directory: datagen, replay and sweep hold an exclusive flock(2) on
//! `.trainio-lock` in --data-dir while they run, so that a second run on the same
//! directory (which would rewrite or read half-written files under the first) is refused
//! with the first one's pid. The kernel releases the lock when its holder exits, however
//! it exits (a SIGKILL included): a stale lock file is never a held lock.
//!
//! In an MPI job only rank 0 takes the lock (the ranks of one job share the directory on
//! purpose); the other ranks learn from rank 0 whether it got it.
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};

use crate::cluster::Cluster;
use crate::errors::InputError;

pub const LOCK: &str = ".trainio-lock";

/// A held lock; dropping it (or exiting) releases it.
pub struct DataDirLock {
    file: Option<File>,
    dir: PathBuf,
    /// The directories made to hold the lock (the data directory and its missing
    /// parents, deepest first).
    created: Vec<PathBuf>,
}

impl Drop for DataDirLock {
    /// Directories made for the lock and left holding nothing else (the run was refused
    /// before it wrote anything) are removed: a refused run leaves nothing behind.
    /// The lock file is removed while the lock is still held (a run that opens it
    /// meanwhile finds it replaced and retries: `acquire`), so a run leaves nothing in a
    /// directory that is not its dataset's (one it refused). A holder killed by SIGKILL
    /// leaves the file, which blocks no one.
    fn drop(&mut self) {
        if let Some(f) = &self.file {
            if same_file(f, &self.dir.join(LOCK)) {
                let _ = std::fs::remove_file(self.dir.join(LOCK));
            }
        }
        let empty = std::fs::read_dir(&self.dir).map(|mut e| e.next().is_none()).unwrap_or(false);
        if empty {
            for d in &self.created {
                let _ = std::fs::remove_dir(d);
            }
        }
    }
}

/// True when `path` (not followed) is the open file `f`.
fn same_file(f: &File, path: &Path) -> bool {
    match (f.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// The pid that holds a flock on the file of (dev, ino), from /proc/locks.
fn holder(dev: u64, ino: u64) -> Option<u32> {
    let text = std::fs::read_to_string("/proc/locks").ok()?;
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // "1: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF" (blocked waiters have "->")
        (f.len() >= 6 && f[1] == "FLOCK" && f[5] == want).then(|| f[4].parse().ok()).flatten()
    })
}

/// Takes the lock of `dir` (creating the directory when `create` and it is missing), or
/// says which process holds it. Returns None when there is no directory to lock (a run
/// that then fails on the missing directory with its own message).
pub fn acquire(dir: &Path, create: bool) -> Result<Option<DataDirLock>> {
    let bad = |why: String| anyhow!(InputError(format!("--data-dir {}: {why}", dir.display())));
    let mut lock = DataDirLock { file: None, dir: dir.to_path_buf(), created: Vec::new() };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Ok(None),
        Err(_) if create && std::fs::symlink_metadata(dir).is_err() => {
            let mut d = Some(dir);
            while let Some(p) = d.filter(|p| !p.as_os_str().is_empty() && std::fs::symlink_metadata(p).is_err()) {
                lock.created.push(p.to_path_buf());
                d = p.parent();
            }
            std::fs::create_dir_all(dir).map_err(|e| bad(format!("cannot create it: {e}")))?;
        }
        Err(_) => return Ok(None),
    }
    // From here on, dropping `lock` removes what was made for it.
    let beneath = crate::beneath::Beneath::new(dir).map_err(|e| bad(format!("{e:#}")))?;
    let mut attempts = 0;
    let file = loop {
        // Opened read-only and never written: a hard link put in its place cannot make
        // the lock write to another file.
        let fd = beneath
            .open(Path::new(LOCK), libc::O_RDONLY | libc::O_CREAT, 0o644)
            .map_err(|e| bad(format!("cannot open its lock file {LOCK}: {e:#}")))?;
        let file = File::from(fd);
        // SAFETY: flock on an fd we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            break Err((file, std::io::Error::last_os_error()));
        }
        // The holder before us removes the file as it ends: a lock on a file no longer
        // in the directory locks nothing, so take the one there now.
        attempts += 1;
        if same_file(&file, &dir.join(LOCK)) || attempts >= 100 {
            break Ok(file);
        }
    };
    let file = match file {
        Ok(f) => f,
        Err((file, e)) => return Err(refused(dir, &file, e)),
    };
    lock.file = Some(file);
    Ok(Some(lock))
}

/// The error for a lock held by another run.
fn refused(dir: &Path, file: &File, e: std::io::Error) -> anyhow::Error {
    let bad = |why: String| anyhow!(InputError(format!("--data-dir {}: {why}", dir.display())));
    if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return bad(format!("cannot lock {LOCK}: {e}"));
    }
    let who = file
        .metadata()
        .ok()
        .and_then(|m| holder(m.dev(), m.ino()))
        .map_or("another process (on another host?)".to_string(), |pid| format!("pid {pid}"));
    bad(format!(
        "in use by another trainio run ({who} holds {}): wait for it to end or give another --data-dir",
        dir.join(LOCK).display()
    ))
}

/// `acquire` on rank 0 of the job; every rank learns whether it succeeded.
pub fn acquire_for_job(cluster: &Cluster, dir: &Path, create: bool) -> Result<Option<DataDirLock>> {
    let mine = if cluster.is_root() { acquire(dir, create) } else { Ok(None) };
    let ok = cluster.broadcast(vec![u8::from(mine.is_ok())]);
    if !cluster.is_root() && ok.first() != Some(&1) {
        bail!("rank 0 could not lock --data-dir {}", dir.display());
    }
    mine
}
