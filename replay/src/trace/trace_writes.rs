//! Trace mode's write bursts: a recorded GPU's writes and syncs (a checkpoint, a log, a
//! shard), repeated after the step they followed in the recording.
//!
//! The calls are blocking syscalls, in the recorded order, from one thread per simulated
//! GPU that writes after that step (the ranks of a job save at the same time):
//! `pwrite` of the recorded length at the recorded offset, `fsync`, `fdatasync`, or
//! `sync_file_range` (SYNC_FILE_RANGE_WRITE: the trace does not hold the flags) on the
//! same range. The files are the GPU's own, under --data-dir; a file is opened (created
//! when missing) at its first call of a burst and closed at the burst's end, as a
//! `torch.save` opens, writes and closes. The event loop waits for every burst to end,
//! so every simulated GPU of the rank stands still, as a rank does while it saves.

use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;

/// One write or sync of a burst, on a file of the simulated GPU.
#[derive(Debug, Clone)]
pub struct WriteCall {
    pub path: PathBuf,
    pub offset: u64,
    pub len: u64,
    /// None for a write, else `fsync`, `fdatasync` or `sync_file_range`.
    pub sync: Option<&'static str>,
}

/// What one burst did.
#[derive(Debug, Clone, Default)]
pub struct BurstIo {
    pub bytes: u64,
    pub writes: u64,
    pub syncs: u64,
    pub files: u64,
}

/// The bursts of several simulated GPUs at once, one thread each (ranks save their
/// checkpoints at the same time), each burst's calls in order. `buf` holds the bytes
/// written (grown to the largest write). Returns each burst's figures and seconds.
pub fn run_bursts(bursts: &[Vec<WriteCall>], buf: &mut Vec<u8>) -> Result<Vec<(BurstIo, f64)>> {
    let longest = bursts.iter().flatten().filter(|c| c.sync.is_none()).map(|c| c.len).max().unwrap_or(0) as usize;
    if buf.len() < longest {
        // Random bytes, so that compressing or deduplicating storage stores them all.
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x7772_6974);
        buf.resize(longest, 0);
        rng.fill(&mut buf[..]);
    }
    let buf = &buf[..];
    let timed = |calls: &Vec<WriteCall>| -> Result<(BurstIo, f64)> {
        let t0 = std::time::Instant::now();
        let io = run_burst(calls, buf)?;
        Ok((io, t0.elapsed().as_secs_f64()))
    };
    if bursts.len() == 1 {
        return Ok(vec![timed(&bursts[0])?]);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = bursts.iter().map(|calls| s.spawn(move || timed(calls))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("trace writer panicked"))))
            .collect()
    })
}

/// Runs `calls` in order, writing from `buf` (at least as long as the longest write).
pub fn run_burst(calls: &[WriteCall], buf: &[u8]) -> Result<BurstIo> {
    let mut open: HashMap<&PathBuf, File> = HashMap::new();
    let mut io = BurstIo::default();
    for c in calls {
        if !open.contains_key(&c.path) {
            if let Some(dir) = c.path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            }
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&c.path)
                .with_context(|| format!("opening {} for writing", c.path.display()))?;
            open.insert(&c.path, f);
        }
        let f = &open[&c.path];
        match c.sync {
            None => {
                f.write_all_at(&buf[..c.len as usize], c.offset)
                    .with_context(|| format!("writing {} bytes at {} of {}", c.len, c.offset, c.path.display()))?;
                io.bytes += c.len;
                io.writes += 1;
            }
            Some(op) => {
                let r = match op {
                    "fsync" => f.sync_all(),
                    "fdatasync" => f.sync_data(),
                    _ => {
                        let rc = unsafe {
                            libc::sync_file_range(
                                f.as_raw_fd(),
                                c.offset as libc::off64_t,
                                c.len as libc::off64_t,
                                libc::SYNC_FILE_RANGE_WRITE,
                            )
                        };
                        if rc == 0 {
                            Ok(())
                        } else {
                            Err(std::io::Error::last_os_error())
                        }
                    }
                };
                r.with_context(|| format!("{op} of {}", c.path.display()))?;
                io.syncs += 1;
            }
        }
    }
    io.files = open.len() as u64;
    Ok(io)
}

/// The results' `writes`: every rank's trace write bursts (CheckpointIo, phase
/// `trace-write`): `bursts` (one per simulated GPU and step), `bytes`, `files`,
/// `duration_s` (per step the longest GPU's time, as MLPerf times a checkpoint, summed
/// over steps), `mib_s` (bytes over that time) and `by_step` (`EPOCH:STEP` → bytes
/// written after that step, epochs from 1).
pub fn summary(per_rank: &[Vec<crate::checkpoint::checkpointing::CheckpointIo>]) -> serde_json::Value {
    let ios: Vec<&crate::checkpoint::checkpointing::CheckpointIo> =
        per_rank.iter().flatten().filter(|c| c.phase == "trace-write").collect();
    let bytes: u64 = ios.iter().map(|c| c.bytes).sum();
    let mut by_step: std::collections::BTreeMap<String, u64> = Default::default();
    let mut longest: std::collections::BTreeMap<(u64, u64), f64> = Default::default();
    for c in &ios {
        *by_step.entry(format!("{}:{}", c.epoch, c.step)).or_default() += c.bytes;
        let l = longest.entry((c.epoch, c.step)).or_default();
        *l = l.max(c.duration_s);
    }
    // fold from +0.0: an empty f64 sum is -0.0, which prints as "-0.00".
    let duration_s: f64 = longest.values().fold(0.0, |a, b| a + b);
    serde_json::json!({
        "bursts": ios.len(),
        "bytes": bytes,
        "files": ios.iter().map(|c| c.files).sum::<u64>(),
        "duration_s": duration_s,
        "mib_s": if duration_s > 0.0 { bytes as f64 / (1u64 << 20) as f64 / duration_s } else { 0.0 },
        "by_step": by_step,
    })
}

/// The results' human line for `writes`.
pub fn human(w: &serde_json::Value) -> String {
    if w["bursts"].as_u64() == Some(0) {
        return String::new(); // a trace without write bursts: nothing to say
    }
    format!(
        "  writes      {} burst(s) from the trace, {:.2} MiB in {:.2} s ({:.1} MiB/s while writing)\n",
        w["bursts"],
        w["bytes"].as_f64().unwrap_or(0.0) / (1u64 << 20) as f64,
        w["duration_s"].as_f64().unwrap_or(0.0),
        w["mib_s"].as_f64().unwrap_or(0.0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_bursts_no_line_and_no_negative_zero() {
        let w = summary(&[]);
        assert_eq!(w["duration_s"].as_f64().unwrap().to_bits(), 0.0f64.to_bits());
        assert_eq!(human(&w), "");
    }

    #[test]
    fn a_burst_writes_its_ranges_and_syncs_in_order() {
        let dir = std::env::temp_dir().join(format!("trainio-trace-writes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = dir.join("gpu00000/w00000.dat");
        let b = dir.join("gpu00000/w00001.dat");
        let call = |path: &PathBuf, offset, len, sync| WriteCall { path: path.clone(), offset, len, sync };
        let calls = vec![
            call(&a, 0, 8192, None),
            call(&a, 8192, 100, None),
            call(&a, 0, 0, Some("fsync")),
            call(&b, 4096, 4096, None),
            call(&b, 4096, 4096, Some("sync_file_range")),
            call(&b, 0, 0, Some("fdatasync")),
        ];
        let mut buf = Vec::new();
        let done = run_bursts(std::slice::from_ref(&calls), &mut buf).unwrap();
        let io = &done[0].0;
        assert_eq!((io.bytes, io.writes, io.syncs, io.files), (8192 + 100 + 4096, 3, 3, 2));
        assert_eq!(buf.len(), 8192, "the buffer holds the longest write");
        assert_eq!(std::fs::metadata(&a).unwrap().len(), 8292);
        assert_eq!(std::fs::metadata(&b).unwrap().len(), 8192, "written at its offset");
        // Written again (the next checkpoint to the same file): the same size, not appended.
        run_burst(&calls, &buf).unwrap();
        assert_eq!(std::fs::metadata(&a).unwrap().len(), 8292);
        // Two GPUs at once, each on its own file.
        let c = dir.join("gpu00001/w00000.dat");
        let other = vec![call(&c, 0, 4096, None), call(&c, 0, 0, Some("fsync"))];
        let done = run_bursts(&[calls.clone(), other], &mut buf).unwrap();
        assert_eq!(done.iter().map(|d| d.0.bytes).collect::<Vec<_>>(), vec![12388, 4096]);
        assert_eq!(std::fs::metadata(&c).unwrap().len(), 4096);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
