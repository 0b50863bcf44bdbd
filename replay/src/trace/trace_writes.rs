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
//!
//! The objects a GPU put (the model's object writes, schema 1.8) go to the object store
//! of `--storage-root`, to the GPU's own copy of each key: a PutObject as one PUT of the
//! recorded size, a multipart upload as CreateMultipartUpload, its parts with their
//! recorded sizes and numbers, at most the recorded count of them in flight at once
//! (one connection each, the parts taken in their recorded order), and
//! CompleteMultipartUpload. Uploads run one after another, in the order they were
//! created. Without an object store, each object is written as a file (`pwrite` of a
//! PUT's body at 0, of a part's at its offset in the object), one call at a time.

use crate::object::s3_client::Client;
use crate::object::s3_writes::S3Target;
use anyhow::{anyhow, bail, Context, Result};
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use trainio_model::writes::ObjectWrite;

/// One write or sync of a burst, on a file of the simulated GPU, or one request putting
/// an object (`object`).
#[derive(Debug, Clone)]
pub struct WriteCall {
    /// The file (unused for an object request).
    pub path: PathBuf,
    pub offset: u64,
    pub len: u64,
    /// None for a write, else `fsync`, `fdatasync` or `sync_file_range`.
    pub sync: Option<&'static str>,
    /// An object request: the key in the object store's bucket, and what the request is.
    pub object: Option<(String, ObjectWrite)>,
}

impl WriteCall {
    /// A write (`sync` None) or sync of a file.
    pub fn file(path: PathBuf, offset: u64, len: u64, sync: Option<&'static str>) -> WriteCall {
        WriteCall { path, offset, len, sync, object: None }
    }
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
/// written (grown to the largest write). Object requests go to `s3`. Returns each
/// burst's figures and seconds.
pub fn run_bursts(bursts: &[Vec<WriteCall>], buf: &mut Vec<u8>, s3: Option<&S3Target>) -> Result<Vec<(BurstIo, f64)>> {
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
        let io = run_burst(calls, buf, s3)?;
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

/// Runs `calls` in order, writing from `buf` (at least as long as the longest write);
/// object requests to `s3`.
pub fn run_burst(calls: &[WriteCall], buf: &[u8], s3: Option<&S3Target>) -> Result<BurstIo> {
    let mut open: HashMap<&PathBuf, File> = HashMap::new();
    let mut io = BurstIo::default();
    let mut conns: Vec<Client> = Vec::new();
    let mut keys: HashSet<&str> = HashSet::new();
    let mut done = vec![false; calls.len()];
    for (i, c) in calls.iter().enumerate() {
        if let Some((key, op)) = &c.object {
            if done[i] {
                continue; // a part or complete of an upload already made
            }
            let s3 = s3.ok_or_else(|| anyhow!("internal error: an object request without an object store"))?;
            keys.insert(key.as_str());
            if conns.is_empty() {
                conns.push(s3.client());
            }
            let bucket = &s3.store.bucket;
            match *op {
                ObjectWrite::Put => {
                    conns[0].put(bucket, key, &buf[..c.len as usize])?;
                    io.bytes += c.len;
                    io.writes += 1;
                }
                ObjectWrite::Create { parallel, .. } => {
                    // The upload's parts and complete: the calls on its key up to the complete.
                    let mut parts = Vec::new();
                    for (j, d) in calls.iter().enumerate().skip(i + 1) {
                        match &d.object {
                            Some((k, ObjectWrite::Part { number })) if k == key => parts.push((*number, d.len)),
                            Some((k, ObjectWrite::Complete)) if k == key => {
                                done[j] = true;
                                break;
                            }
                            _ => continue,
                        }
                        done[j] = true;
                    }
                    upload(&mut conns, s3, key, &parts, parallel as usize, buf)?;
                    io.bytes += parts.iter().map(|p| p.1).sum::<u64>();
                    io.writes += parts.len() as u64;
                }
                ObjectWrite::Part { .. } | ObjectWrite::Complete => {
                    bail!("internal error: s3://{bucket}/{key}: a part or complete outside its upload")
                }
            }
            continue;
        }
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
    io.files = (open.len() + keys.len()) as u64;
    Ok(io)
}

/// A multipart upload of `key`: `parts` (number, bytes) in their recorded order, at most
/// `parallel` in flight, each thread on a connection of its own (`conns` grows to them).
fn upload(
    conns: &mut Vec<Client>,
    s3: &S3Target,
    key: &str,
    parts: &[(u32, u64)],
    parallel: usize,
    buf: &[u8],
) -> Result<()> {
    let bucket = &s3.store.bucket;
    let mut numbers: Vec<u32> = parts.iter().map(|p| p.0).collect();
    numbers.sort_unstable();
    if !numbers.iter().enumerate().all(|(i, &n)| n as usize == i + 1) {
        bail!("s3://{bucket}/{key}: the trace's parts are not numbered 1..{}", parts.len());
    }
    let width = parallel.clamp(1, parts.len().max(1));
    while conns.len() < width {
        conns.push(s3.client());
    }
    let id = conns[0].create_multipart(bucket, key)?;
    let next = AtomicUsize::new(0);
    let etags: Mutex<Vec<(u32, String)>> = Mutex::new(Vec::with_capacity(parts.len()));
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = conns[..width]
            .iter_mut()
            .map(|c| {
                let (next, etags, id) = (&next, &etags, &id);
                s.spawn(move || -> Result<()> {
                    loop {
                        let Some(&(number, len)) = parts.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            return Ok(());
                        };
                        let etag = c.upload_part(bucket, key, id, number, &buf[..len as usize])?;
                        etags.lock().unwrap().push((number, etag));
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a PUT thread panicked")))).collect()
    });
    if let Some(e) = results.into_iter().find_map(Result::err) {
        conns[0].abort_multipart(bucket, key, &id);
        conns.clear(); // a failed request may leave its connection mid-response
        return Err(e);
    }
    let mut etags = etags.into_inner().unwrap();
    etags.sort_unstable();
    let etags: Vec<String> = etags.into_iter().map(|(_, e)| e).collect();
    conns[0].complete_multipart(bucket, key, &id, &etags)
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
        let call = |path: &PathBuf, offset, len, sync| WriteCall::file(path.clone(), offset, len, sync);
        let calls = vec![
            call(&a, 0, 8192, None),
            call(&a, 8192, 100, None),
            call(&a, 0, 0, Some("fsync")),
            call(&b, 4096, 4096, None),
            call(&b, 4096, 4096, Some("sync_file_range")),
            call(&b, 0, 0, Some("fdatasync")),
        ];
        let mut buf = Vec::new();
        let done = run_bursts(std::slice::from_ref(&calls), &mut buf, None).unwrap();
        let io = &done[0].0;
        assert_eq!((io.bytes, io.writes, io.syncs, io.files), (8192 + 100 + 4096, 3, 3, 2));
        assert_eq!(buf.len(), 8192, "the buffer holds the longest write");
        assert_eq!(std::fs::metadata(&a).unwrap().len(), 8292);
        assert_eq!(std::fs::metadata(&b).unwrap().len(), 8192, "written at its offset");
        // Written again (the next checkpoint to the same file): the same size, not appended.
        run_burst(&calls, &buf, None).unwrap();
        assert_eq!(std::fs::metadata(&a).unwrap().len(), 8292);
        // Two GPUs at once, each on its own file.
        let c = dir.join("gpu00001/w00000.dat");
        let other = vec![call(&c, 0, 4096, None), call(&c, 0, 0, Some("fsync"))];
        let done = run_bursts(&[calls.clone(), other], &mut buf, None).unwrap();
        assert_eq!(done.iter().map(|d| d.0.bytes).collect::<Vec<_>>(), vec![12388, 4096]);
        assert_eq!(std::fs::metadata(&c).unwrap().len(), 4096);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
