//! The `s3` I/O backend of the replay engine: each reader slot (a DataLoader worker of a
//! simulated GPU) is a thread with its own connections to the endpoint, and a sample read
//! becomes the requests its storage library issues (object_store::Pattern): one GET of
//! the whole object, or ranged GETs of the library's part size with several in flight.
//! The engine's state machine, step barrier and AU are the same as for files: only the
//! I/O under a read changes.

use crate::engine::Backend;
use crate::object::object_store::{join_key, Pattern};
use crate::object::s3_client::{Client, Endpoint, RequestLog, SharedLog};
use anyhow::{anyhow, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

struct Request {
    key: String,
    size: u64,
    offset: u64,
    len: u64,
}

/// Objects of the dataset: the engine names them by path under `root`, the bucket holds
/// them under `prefix`.
pub struct ObjectSet {
    pub bucket: String,
    pub prefix: String,
    pub root: PathBuf,
    /// Size of each object, by path relative to `root`.
    pub sizes: HashMap<PathBuf, u64>,
}

pub struct S3Reads {
    start: Instant,
    objects: ObjectSet,
    open: Vec<Option<(String, u64)>>,
    free: Vec<usize>,
    jobs: Vec<Sender<Request>>,
    done: Receiver<(usize, Result<u64>)>,
    threads: Vec<std::thread::JoinHandle<()>>,
    log: SharedLog,
    buf_len: u64,
}

/// Reads [offset, offset+len) of an object as the library does, over `conns`.
fn read_as_library(
    conns: &mut Vec<Client>,
    ep: &Arc<Endpoint>,
    log: &SharedLog,
    p: Pattern,
    bucket: &str,
    r: &Request,
) -> Result<u64> {
    let end = (r.offset + r.len).min(r.size);
    if r.offset >= end {
        return Ok(0);
    }
    if conns.is_empty() {
        conns.push(Client::new(ep.clone(), log.clone()));
    }
    if p.get_part == 0 {
        let range = (r.offset > 0 || end < r.size).then_some((r.offset, end));
        return conns[0].get(bucket, &r.key, range);
    }
    // Ranged parts aligned on the part size, as the CRT splits a GET.
    let mut parts = Vec::new();
    let mut at = r.offset;
    while at < end {
        let stop = ((at / p.get_part + 1) * p.get_part).min(end);
        parts.push((at, stop));
        at = stop;
    }
    let width = parts.len().min(p.get_parallel.max(1));
    while conns.len() < width {
        conns.push(Client::new(ep.clone(), log.clone()));
    }
    let mut total = 0;
    for wave in parts.chunks(width) {
        let results: Vec<Result<u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = conns
                .iter_mut()
                .zip(wave)
                .map(|(c, &range)| s.spawn(move || c.get(bucket, &r.key, Some(range))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a GET thread panicked")))).collect()
        });
        for x in results {
            total += x?;
        }
    }
    Ok(total)
}

impl S3Reads {
    pub fn new(slots: usize, ep: Endpoint, pattern: Pattern, objects: ObjectSet, buf_len: u64) -> Result<S3Reads> {
        let ep = Arc::new(ep);
        let log: SharedLog = Arc::new(Mutex::new(RequestLog::default()));
        let (done_tx, done) = channel();
        let mut jobs = Vec::with_capacity(slots);
        let mut threads = Vec::with_capacity(slots);
        for slot in 0..slots {
            let (tx, rx) = channel::<Request>();
            let (ep, log, done_tx, bucket) = (ep.clone(), log.clone(), done_tx.clone(), objects.bucket.clone());
            let t = std::thread::Builder::new().name(format!("s3-reader-{slot}")).spawn(move || {
                let mut conns = Vec::new();
                for r in rx {
                    let res = read_as_library(&mut conns, &ep, &log, pattern, &bucket, &r);
                    if res.is_err() {
                        conns.clear();
                    }
                    if done_tx.send((slot, res)).is_err() {
                        break;
                    }
                }
                crate::engine::client::add_io_thread();
            })?;
            jobs.push(tx);
            threads.push(t);
        }
        Ok(S3Reads {
            start: Instant::now(),
            objects,
            open: Vec::new(),
            free: Vec::new(),
            jobs,
            done,
            threads,
            log,
            buf_len,
        })
    }

    fn take(&self, (slot, res): (usize, Result<u64>), out: &mut Vec<(usize, i32)>) -> Result<()> {
        let n = res?;
        out.push((slot, n.min(i32::MAX as u64) as i32));
        Ok(())
    }
}

impl Backend for S3Reads {
    fn start(&mut self) -> Result<()> {
        self.start = Instant::now();
        Ok(())
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn buf_len(&self) -> u64 {
        self.buf_len
    }

    fn open(&mut self, path: &Path) -> Result<i32> {
        let rel = path.strip_prefix(&self.objects.root).unwrap_or(path);
        let size =
            *self.objects.sizes.get(rel).ok_or_else(|| anyhow!("{}: not an object of the dataset", rel.display()))?;
        let key = join_key(&[&self.objects.prefix, &rel.to_string_lossy()]);
        let entry = Some((key, size));
        let fd = match self.free.pop() {
            Some(i) => {
                self.open[i] = entry;
                i
            }
            None => {
                self.open.push(entry);
                self.open.len() - 1
            }
        };
        Ok(fd as i32)
    }

    fn close(&mut self, fd: i32) {
        if let Some(e) = self.open.get_mut(fd as usize) {
            *e = None;
            self.free.push(fd as usize);
        }
    }

    fn submit(&mut self, slot: usize, fd: i32, offset: u64, len: u32) -> Result<()> {
        let (key, size) =
            self.open.get(fd as usize).cloned().flatten().ok_or_else(|| anyhow!("read of a closed object"))?;
        self.jobs[slot]
            .send(Request { key, size, offset, len: len as u64 })
            .map_err(|_| anyhow!("S3 reader {slot} stopped"))
    }

    fn wait(&mut self, wait_ns: u64, out: &mut Vec<(usize, i32)>) -> Result<()> {
        let first = match wait_ns {
            0 => self.done.try_recv().ok(),
            u64::MAX => Some(self.done.recv().map_err(|_| anyhow!("every S3 reader stopped"))?),
            ns => match self.done.recv_timeout(Duration::from_nanos(ns)) {
                Ok(c) => Some(c),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return Err(anyhow!("every S3 reader stopped")),
            },
        };
        if let Some(c) = first {
            self.take(c, out)?;
            while let Ok(c) = self.done.try_recv() {
                self.take(c, out)?;
            }
        }
        Ok(())
    }

    fn object_log(&self) -> Option<serde_json::Value> {
        Some(self.log.lock().unwrap().to_wire())
    }
}

impl Drop for S3Reads {
    fn drop(&mut self) {
        self.jobs.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
