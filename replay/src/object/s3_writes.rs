//! Object storage outside the read loop: the check before any work (endpoint,
//! credentials, bucket), the dataset's listing, datagen's objects and checkpoint shards,
//! each PUT as the workload's library issues it (one PutObject, or a multipart upload of
//! its part size with its parts in flight at once).

use crate::checkpoint::{Plan, RankIo};
use crate::dataset::Layout;
use crate::errors::InputError;
use crate::object::object_store::{join_key, ObjectStore, Pattern};
use crate::object::s3_client::{Client, Endpoint, RequestLog, SharedLog};
use anyhow::{anyhow, bail, Context, Result};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A workload's object storage with its endpoint resolved and checked.
#[derive(Debug, Clone)]
pub struct S3Target {
    pub store: ObjectStore,
    pub endpoint: Arc<Endpoint>,
    /// Every request this process made outside the replay's reads.
    pub log: SharedLog,
}

/// Resolves the endpoint and credentials from the environment and checks, with one
/// HeadBucket per bucket, that the endpoint answers, the keys are accepted and the
/// bucket exists: before anything is written or timed.
pub fn preflight(store: &ObjectStore, extra_buckets: &[String]) -> Result<S3Target> {
    let env = |k: &str| std::env::var(k).ok();
    let endpoint = Arc::new(store.endpoint(&env).map_err(|e| InputError(format!("{e:#}")))?);
    let log: SharedLog = Arc::new(Mutex::new(RequestLog::default()));
    let mut client = Client::new(endpoint.clone(), log.clone());
    let mut buckets = vec![store.bucket.clone()];
    buckets.extend(extra_buckets.iter().filter(|b| **b != store.bucket).cloned());
    for bucket in &buckets {
        let status = client.head_bucket(bucket).map_err(|e| InputError(format!("{e:#}")))?;
        match status {
            200 => {}
            403 | 400 | 401 => bail!(InputError(format!(
                "S3 endpoint {}: the credentials (AWS_ACCESS_KEY_ID {}) are refused for bucket {bucket} (HTTP {status})",
                endpoint.url, endpoint.access_key
            ))),
            404 => bail!(InputError(format!("s3://{bucket}: no such bucket at {} (create it first)", endpoint.url))),
            s => bail!(InputError(format!("s3://{bucket} at {}: HeadBucket answered HTTP {s}", endpoint.url))),
        }
    }
    Ok(S3Target { store: store.clone(), endpoint, log })
}

impl S3Target {
    pub fn client(&self) -> Client {
        Client::new(self.endpoint.clone(), self.log.clone())
    }

    /// The key of a dataset file.
    pub fn key_of(&self, rel: &std::path::Path) -> String {
        join_key(&[&self.store.prefix, &rel.to_string_lossy()])
    }

    /// Sizes of the objects of the dataset that exist, by path relative to the layout's
    /// root: those under its top folder (`train/`, or a trace's `trace/`).
    pub fn dataset_objects(&self, layout: &Layout) -> Result<HashMap<PathBuf, u64>> {
        let top = layout.files.first().and_then(|f| f.rel.iter().next()).map(|c| c.to_string_lossy().into_owned());
        let top = top.unwrap_or_else(|| "train".into());
        let listed = self.client().list(&self.store.bucket, &join_key(&[&self.store.prefix, &top]))?;
        let strip = if self.store.prefix.is_empty() { String::new() } else { format!("{}/", self.store.prefix) };
        Ok(listed
            .into_iter()
            .filter_map(|(k, size)| k.strip_prefix(&strip).map(|rel| (PathBuf::from(rel), size)))
            .collect())
    }

    /// Checks that the objects `which` of `layout` exist with their planned sizes.
    pub fn verify(&self, layout: &Layout, which: &[usize], have: &HashMap<PathBuf, u64>) -> Result<()> {
        for &i in which {
            let f = &layout.files[i];
            match have.get(&f.rel) {
                Some(&s) if s == f.size => {}
                Some(&s) => bail!(InputError(format!(
                    "s3://{}/{}: {s} bytes, expected {}: regenerate with 'trainio datagen' or --generate",
                    self.store.bucket,
                    self.key_of(&f.rel),
                    f.size
                ))),
                None => bail!(InputError(format!(
                    "s3://{}/{}: missing: this run needs {} objects and {} holds {}: run 'trainio datagen' with the same workload, --gpus and --steps, or pass --generate",
                    self.store.bucket,
                    self.key_of(&f.rel),
                    layout.files.len(),
                    self.store.uri(),
                    have.len()
                ))),
            }
        }
        Ok(())
    }
}

/// PUTs `body` as `key` the way `p` says: one request at or below the multipart
/// threshold, else a multipart upload whose parts go `p.put_parallel` at a time over
/// `conns` (grown to that many connections).
pub fn put_object(
    conns: &mut Vec<Client>,
    target: &S3Target,
    p: Pattern,
    bucket: &str,
    key: &str,
    body: &[u8],
) -> Result<()> {
    if conns.is_empty() {
        conns.push(target.client());
    }
    if body.len() as u64 <= p.multipart_threshold {
        return conns[0].put(bucket, key, body);
    }
    let parts: Vec<&[u8]> = body.chunks(p.put_part as usize).collect();
    let width = parts.len().min(p.put_parallel.max(1));
    while conns.len() < width {
        conns.push(target.client());
    }
    let upload = conns[0].create_multipart(bucket, key)?;
    let mut etags = Vec::with_capacity(parts.len());
    let mut failed = None;
    for (w, wave) in parts.chunks(width).enumerate() {
        let results: Vec<Result<String>> = std::thread::scope(|s| {
            let upload = &upload;
            let handles: Vec<_> = conns
                .iter_mut()
                .zip(wave.iter().enumerate())
                .map(|(c, (i, part))| {
                    let number = (w * width + i + 1) as u32;
                    s.spawn(move || c.upload_part(bucket, key, upload, number, part))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a PUT thread panicked")))).collect()
        });
        for r in results {
            match r {
                Ok(e) => etags.push(e),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if failed.is_some() {
            break;
        }
    }
    if let Some(e) = failed {
        conns[0].abort_multipart(bucket, key, &upload);
        return Err(e);
    }
    conns[0].complete_multipart(bucket, key, &upload, &etags)
}

/// Fills `buf` (bytes `at..` of an object) with random data stamped per MiB with the
/// object and the MiB, so deduplicating storage cannot collapse it.
fn stamped(block: &[u8], object: u64) -> impl FnMut(&mut [u8], u64) + '_ {
    move |buf: &mut [u8], at: u64| {
        for (k, b) in buf.iter_mut().enumerate() {
            let pos = at + k as u64;
            let within = (pos % block.len() as u64) as usize;
            *b = match within {
                0..=7 => object.to_le_bytes()[within],
                8..=15 => (pos / block.len() as u64).to_le_bytes()[within - 8],
                _ => block[within],
            };
        }
    }
}

/// Datagen to object storage: rank `part` of `parts` PUTs its share of the layout's files
/// (every `parts`-th), skipping objects already there with their planned size. Each object
/// is laid out in the workload's format (formats.rs), as datagen writes a file.
pub fn generate(target: &S3Target, layout: &Layout, part: usize, parts: usize) -> Result<u64> {
    let have = target.dataset_objects(layout)?;
    let pattern = target.store.library.pattern();
    let mut block = vec![0u8; 1 << 20];
    rand::rngs::StdRng::seed_from_u64(0x0074_7261_696e_696f).fill(&mut block[..]);
    let mut conns = Vec::new();
    let mut bytes = 0;
    for i in (0..layout.files.len()).filter(|i| i % parts == part) {
        let f = &layout.files[i];
        if have.get(&f.rel) == Some(&f.size) {
            continue;
        }
        let mut body: Vec<u8> = Vec::with_capacity(f.size as usize);
        let mut fill = stamped(&block, i as u64);
        let patch = crate::formats::write_file(layout.format, &mut body, layout.samples_per_file, f.sample, &mut fill)
            .with_context(|| format!("laying out {}", f.rel.display()))?;
        if let Some((at, b)) = patch {
            body[at as usize..at as usize + b.len()].copy_from_slice(&b);
        }
        if body.len() as u64 != f.size {
            bail!("{}: laid out {} bytes, the layout says {}", f.rel.display(), body.len(), f.size);
        }
        put_object(&mut conns, target, pattern, &target.store.bucket, &target.key_of(&f.rel), &body)?;
        bytes += f.size;
    }
    Ok(bytes)
}

/// Where checkpoint (`epoch`, `step`) goes: (bucket, key prefix), DLIO's directory name
/// under the checkpoint folder.
pub fn checkpoint_prefix(target: &S3Target, folder: &str, epoch: u64, step: u64) -> (String, String) {
    let (bucket, prefix) = target.store.checkpoint_location(folder);
    (bucket, join_key(&[&prefix, &format!("global_epoch{epoch}_step{step}")]))
}

/// Runs `io` for each simulated GPU of `ranks` on a thread of its own, adding up.
fn each_rank(ranks: &[u64], io: impl Fn(u64) -> Result<RankIo> + Sync) -> Result<RankIo> {
    let io = &io;
    let results: Vec<Result<RankIo>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks.iter().map(|&r| s.spawn(move || io(r))).collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a checkpoint thread panicked")))).collect()
    });
    let mut total = RankIo::default();
    for r in results {
        let r = r?;
        total.bytes += r.bytes;
        total.files += r.files;
    }
    Ok(total)
}

/// Writes the shards of the simulated GPUs `ranks` as objects under `prefix`, one thread
/// per simulated GPU, each shard one PUT or multipart upload as the library does it.
pub fn write_shards(target: &S3Target, plan: &Plan, ranks: &[u64], bucket: &str, prefix: &str) -> Result<RankIo> {
    let pattern = target.store.library.pattern();
    each_rank(ranks, |r| {
        let mut conns = Vec::new();
        let mut io = RankIo::default();
        let largest = plan.files[r as usize].iter().map(|f| f.bytes).max().unwrap_or(0);
        let mut body = vec![0u8; largest as usize];
        rand::rngs::StdRng::seed_from_u64(0x636b_7074 ^ r).fill(&mut body[..]);
        for (k, f) in plan.files[r as usize].iter().enumerate() {
            let body = &mut body[..f.bytes as usize];
            if body.len() >= 16 {
                body[..8].copy_from_slice(&((r << 20) ^ k as u64).to_le_bytes());
            }
            put_object(&mut conns, target, pattern, bucket, &join_key(&[prefix, &f.name]), body)?;
            io.bytes += f.bytes;
            io.files += 1;
        }
        Ok(io)
    })
}

/// Checks that the shards of `ranks` under `prefix` exist with their planned sizes (the
/// read phase's precondition; not timed).
pub fn check_shards(target: &S3Target, plan: &Plan, ranks: &[u64], bucket: &str, prefix: &str) -> Result<()> {
    let listed: HashMap<String, u64> = target.client().list(bucket, &format!("{prefix}/"))?.into_iter().collect();
    for &r in ranks {
        for f in &plan.files[r as usize] {
            let key = join_key(&[prefix, &f.name]);
            match listed.get(&key) {
                Some(&s) if s == f.bytes => {}
                Some(&s) => bail!(
                    "s3://{bucket}/{key}: {s} bytes, the plan says {}: written by another model or --gpus",
                    f.bytes
                ),
                None => {
                    bail!("s3://{bucket}/{key}: missing: write the checkpoint first (checkpoint.num_checkpoints_write)")
                }
            }
        }
    }
    Ok(())
}

/// Reads the shards of `ranks` back, one thread per simulated GPU, each shard as the
/// library reads an object (whole, or in parallel ranged parts).
pub fn read_shards(target: &S3Target, plan: &Plan, ranks: &[u64], bucket: &str, prefix: &str) -> Result<RankIo> {
    let p = target.store.library.pattern();
    each_rank(ranks, |r| {
        let mut conns: Vec<Client> = vec![target.client()];
        let mut io = RankIo::default();
        for f in &plan.files[r as usize] {
            let key = join_key(&[prefix, &f.name]);
            let got = if p.get_part == 0 {
                conns[0].get(bucket, &key, None)?
            } else {
                let ranges: Vec<(u64, u64)> = (0..f.bytes.div_ceil(p.get_part))
                    .map(|i| (i * p.get_part, ((i + 1) * p.get_part).min(f.bytes)))
                    .collect();
                let width = ranges.len().clamp(1, p.get_parallel);
                while conns.len() < width {
                    conns.push(target.client());
                }
                let mut got = 0;
                for wave in ranges.chunks(width) {
                    let res: Vec<Result<u64>> = std::thread::scope(|s| {
                        let key = &key;
                        let hs: Vec<_> = conns
                            .iter_mut()
                            .zip(wave)
                            .map(|(c, &rg)| s.spawn(move || c.get(bucket, key, Some(rg))))
                            .collect();
                        hs.into_iter()
                            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a GET thread panicked"))))
                            .collect()
                    });
                    for x in res {
                        got += x?;
                    }
                }
                got
            };
            if got != f.bytes {
                bail!("s3://{bucket}/{key}: read {got} bytes, the plan says {}", f.bytes);
            }
            io.bytes += got;
            io.files += 1;
        }
        Ok(io)
    })
}

/// The ranks' request logs (RequestLog::to_wire) added up, as the results' `object`
/// section; None when no rank used object storage.
pub fn combine_logs<'a>(logs: impl Iterator<Item = &'a serde_json::Value>) -> Option<serde_json::Value> {
    let mut total: Option<RequestLog> = None;
    for l in logs.filter_map(RequestLog::from_wire) {
        total.get_or_insert_with(RequestLog::default).merge(&l);
    }
    total.map(|t| t.to_json())
}

impl S3Target {
    /// What the results' `settings.storage` says.
    pub fn settings_json(&self) -> serde_json::Value {
        let p = self.store.library.pattern();
        serde_json::json!({
            "storage_type": "s3",
            "uri": self.store.uri(),
            "endpoint": self.endpoint.url,
            "region": self.endpoint.region,
            "library": self.store.library.name(),
            "get_part_bytes": p.get_part,
            "get_parallel": p.get_parallel,
            "multipart_threshold_bytes": p.multipart_threshold,
            "put_part_bytes": p.put_part,
            "put_parallel": p.put_parallel,
        })
    }
}
