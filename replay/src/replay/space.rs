//! Room on the file system before a run writes: the free space datagen's checks compare
//! the dataset with (datagen.rs), and the checkpoints a run will take, each host's share
//! against the file system under --data-dir on that host.

use super::Job;
use crate::checkpoint::checkpointing::Checkpointer;
use crate::cluster::Cluster;
use crate::dataset;
use crate::errors::InputError;
use crate::mlperf::datasize;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The free space of the file system that holds a path.
pub(super) struct Free {
    /// Bytes an unprivileged writer may still use.
    pub bytes: u64,
    /// The path's nearest existing ancestor (the path itself when it exists).
    pub dir: PathBuf,
    /// statvfs's file system id: ranks of one host on one file system share the room.
    pub fsid: u64,
}

/// The free space of the file system that holds `path`, or will hold it.
pub(super) fn free_space(path: &Path) -> Result<Free> {
    use std::os::unix::ffi::OsStrExt;
    let mut dir = path.to_path_buf();
    while !dir.exists() {
        match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => dir = p.to_path_buf(),
            _ => {
                dir = PathBuf::from(".");
                break;
            }
        }
    }
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a NUL-terminated path and st a statvfs to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        bail!("statvfs {}: {}", dir.display(), std::io::Error::last_os_error());
    }
    Ok(Free { bytes: st.f_bavail as u64 * st.f_frsize as u64, dir, fsid: st.f_fsid as u64 })
}

/// What one rank tells rank 0 for the checkpoint check.
#[derive(serde::Serialize, serde::Deserialize)]
struct RankRoom {
    host: String,
    fsid: u64,
    free: u64,
    dir: PathBuf,
    /// Bytes of earlier runs' checkpoint files that this run overwrites.
    have: u64,
    /// Bytes this rank's simulated GPUs write over the run.
    need: u64,
}

impl Job {
    /// Refuses, before the first step, checkpoints that do not fit. Each rank's simulated
    /// GPUs write their shards `writes` times (each file counted one 4 KiB block more, for
    /// its extents and directory entry); the ranks of one host on one file system add up,
    /// less what the checkpoints of an earlier run hold at the paths this run overwrites
    /// (`will_write(epoch, step)` says which), against that file system's free space.
    /// Hosts that share a file system are each checked for their own part. Rank 0 decides;
    /// object storage is not checked.
    pub(super) fn check_checkpoint_space(
        &self,
        cluster: &Cluster,
        ckpt: &Checkpointer,
        writes: u64,
        will_write: impl Fn(u64, u64) -> bool,
    ) -> Result<()> {
        if ckpt.s3.is_some() || writes == 0 {
            return Ok(());
        }
        let per_write: u64 = ckpt
            .local
            .iter()
            .map(|&r| ckpt.plan.rank_bytes(r) + ckpt.plan.files[r as usize].len() as u64 * dataset::ALIGN)
            .sum();
        let free = free_space(&self.data_dir)?;
        let mine = RankRoom {
            host: cluster.hostname.clone(),
            fsid: free.fsid,
            free: free.bytes,
            dir: free.dir,
            have: overwritten_bytes(&ckpt.root.join(&ckpt.spec.folder), &will_write),
            need: per_write.saturating_mul(writes),
        };
        let Some(all) = cluster.gather(serde_json::to_vec(&mine)?) else {
            return Ok(());
        };
        let mut rooms: BTreeMap<(String, u64), RankRoom> = BTreeMap::new();
        for bytes in all {
            let r: RankRoom = serde_json::from_slice(&bytes).context("decoding a rank's free space")?;
            match rooms.get_mut(&(r.host.clone(), r.fsid)) {
                Some(room) => {
                    room.need = room.need.saturating_add(r.need);
                    room.free = room.free.min(r.free);
                    room.have = room.have.max(r.have);
                }
                None => {
                    rooms.insert((r.host.clone(), r.fsid), r);
                }
            }
        }
        let hosts = rooms.len();
        for room in rooms.values() {
            if room.need.saturating_sub(room.have) > room.free {
                bail!(InputError(format!(
                    "--data-dir {}: {writes} checkpoint(s) of {} (in {}) need {}{} and the file system of {} has {} free: write fewer checkpoints (checkpoint.steps_between_checkpoints, epochs_between_checkpoints or num_checkpoints_write), lower --gpus or --steps, or free space",
                    self.data_dir.display(),
                    datasize::human_bytes((room.need / writes) as f64),
                    ckpt.spec.folder,
                    datasize::human_bytes(room.need.saturating_sub(room.have) as f64),
                    if hosts > 1 { format!(" on {}", room.host) } else { String::new() },
                    room.dir.display(),
                    datasize::human_bytes(room.free as f64)
                )));
            }
        }
        Ok(())
    }
}

/// The bytes of the files in `folder`'s checkpoint directories (`global_epochE_stepS`)
/// that this run writes again, by `will_write(E, S)`: they are replaced, so their room is
/// the run's.
fn overwritten_bytes(folder: &Path, will_write: &impl Fn(u64, u64) -> bool) -> u64 {
    let Ok(dirs) = std::fs::read_dir(folder) else { return 0 };
    let mut total = 0u64;
    for d in dirs.flatten() {
        let name = d.file_name();
        let Some((e, s)) = name.to_str().and_then(epoch_step) else { continue };
        if !will_write(e, s) || !d.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(d.path()) else { continue };
        for f in files.flatten() {
            if let Ok(m) = f.metadata() {
                if m.is_file() {
                    total = total.saturating_add(m.len());
                }
            }
        }
    }
    total
}

/// (E, S) of a checkpoint directory's name, `global_epochE_stepS`.
fn epoch_step(name: &str) -> Option<(u64, u64)> {
    let (e, s) = name.strip_prefix("global_epoch")?.split_once("_step")?;
    Some((e.parse().ok()?, s.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_directories_are_named_by_epoch_and_step() {
        assert_eq!(epoch_step("global_epoch2_step15"), Some((2, 15)));
        assert_eq!(epoch_step("global_epoch2_step"), None);
        assert_eq!(epoch_step("epoch2_step15"), None);
    }

    /// Only the directories the run writes again count, and only their regular files.
    #[test]
    fn overwritten_bytes_counts_the_checkpoints_this_run_replaces() {
        let root = std::env::temp_dir().join(format!("trainio-space-{}", std::process::id()));
        let write = |rel: &str, n: usize| {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, vec![0u8; n]).unwrap();
        };
        write("global_epoch1_step5/a.pt", 100);
        write("global_epoch1_step5/b.pt", 20);
        write("global_epoch1_step7/a.pt", 1000);
        write("other/a.pt", 5000);
        let n = overwritten_bytes(&root, &|e, s| e == 1 && s % 5 == 0);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(n, 120);
        assert_eq!(overwritten_bytes(&root, &|_, _| true), 0, "no folder: nothing to replace");
    }
}
