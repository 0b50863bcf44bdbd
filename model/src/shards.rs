//! Streamed shards: samples per step counted from a tar shard's members.
//!
//! A WebDataset (or any tar-streaming) loader reads its shard front to back across many
//! steps and forms batches inside the worker, so one open covers many batches and the
//! opens say nothing about the samples in a step. When the recorded shard can be read
//! where the model runs (the same host, or a copy at the same path), its member index
//! says which samples a step's bytes completed: a sample is the group of members that
//! share a key (the member name up to the first `.` of its last path component, as
//! WebDataset groups them), and it belongs to the step whose reads reached the end of
//! its last member.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read as _, Seek, SeekFrom};
use std::path::Path;

use crate::job::Step;

const BLOCK: u64 = 512;
/// Members read from one shard's index at most (a shard of a million members is 512 MB of
/// headers to seek through; beyond this the shard is left to the opens).
const MAX_MEMBERS: usize = 1 << 20;

/// The end offsets (in the archive) of each sample's last member, sorted; None when
/// `path` is not a readable POSIX tar archive.
pub fn sample_ends(path: &Path) -> Option<Vec<u64>> {
    let mut f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let mut ends: HashMap<String, u64> = HashMap::new();
    let mut off = 0u64;
    let mut header = [0u8; BLOCK as usize];
    for _ in 0..MAX_MEMBERS {
        if off + BLOCK > len {
            break;
        }
        f.seek(SeekFrom::Start(off)).ok()?;
        f.read_exact(&mut header).ok()?;
        if header.iter().all(|&b| b == 0) {
            break; // the end-of-archive blocks
        }
        if &header[257..262] != b"ustar" {
            return None;
        }
        let size = octal(&header[124..136])?;
        let data = off + BLOCK;
        let kind = header[156];
        if kind == b'0' || kind == 0 {
            let name = String::from_utf8_lossy(&header[..100]).trim_end_matches('\0').to_string();
            let prefix = String::from_utf8_lossy(&header[345..500]).trim_end_matches('\0').to_string();
            let full = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
            let e = ends.entry(sample_key(&full)).or_default();
            *e = (*e).max(data + size);
        }
        off = data + size.div_ceil(BLOCK) * BLOCK;
    }
    if ends.is_empty() {
        return None;
    }
    let mut v: Vec<u64> = ends.into_values().collect();
    v.sort_unstable();
    Some(v)
}

fn octal(field: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(field).ok()?.trim_matches(|c: char| c == '\0' || c == ' ');
    if s.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(s, 8).ok()
}

/// WebDataset's key of a member: its path without what follows the first `.` of the
/// last component (`train/000123.seg.png` -> `train/000123`).
fn sample_key(member: &str) -> String {
    let (dir, base) = member.rsplit_once('/').map_or(("", member), |(d, b)| (d, b));
    let stem = base.split_once('.').map_or(base, |(s, _)| s);
    if dir.is_empty() {
        stem.to_string()
    } else {
        format!("{dir}/{stem}")
    }
}

/// Recounts the samples of `steps` that read tar shards: per reader and shard, a step
/// holds the samples whose last member ends past what that reader had read of the shard
/// before the step, up to what it read by the step's end. Steps must be in the order
/// each reader took them. `files` are the recorded paths (Read::file indexes them).
/// Returns the shards recounted and those named like tar files that could not be read.
pub fn recount(steps: &mut [Step], files: &[(String, u64)]) -> (usize, Vec<String>) {
    let mut index: HashMap<u32, Option<Vec<u64>>> = HashMap::new();
    let mut unreadable = Vec::new();
    for s in steps.iter() {
        for r in &s.reads {
            index.entry(r.file).or_insert_with(|| {
                let name = &files[r.file as usize].0;
                let ends = sample_ends(Path::new(name));
                if ends.is_none() && name.ends_with(".tar") {
                    unreadable.push(name.clone());
                }
                ends
            });
        }
    }
    let shards = index.values().filter(|v| v.is_some()).count();
    if shards == 0 {
        return (0, unreadable);
    }
    // What each reader had read of each shard so far: its high-water mark.
    let mut done: HashMap<(u32, u32), u64> = HashMap::new();
    for s in steps.iter_mut() {
        let mut reached: HashMap<(u32, u32), u64> = HashMap::new();
        for r in &s.reads {
            if index.get(&r.file).is_some_and(|v| v.is_some()) {
                let e = reached.entry((r.reader, r.file)).or_default();
                *e = (*e).max(r.offset + r.len);
            }
        }
        if reached.is_empty() {
            continue;
        }
        let mut samples = 0u32;
        for (key, hi) in reached {
            let ends = index[&key.1].as_ref().expect("a tar index");
            let lo = done.get(&key).copied().unwrap_or(0);
            if hi > lo {
                let from = ends.partition_point(|&e| e <= lo);
                let to = ends.partition_point(|&e| e <= hi);
                samples += (to - from) as u32;
                done.insert(key, hi);
            }
        }
        s.samples = samples;
    }
    (shards, unreadable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Read;
    use std::io::Write;

    /// A POSIX tar of `members` (name, size), written as tar and Python's tarfile do.
    fn tar(path: &Path, members: &[(&str, usize)]) {
        let mut f = File::create(path).unwrap();
        for (name, size) in members {
            let mut h = [0u8; 512];
            h[..name.len()].copy_from_slice(name.as_bytes());
            h[100..108].copy_from_slice(b"0000644\0");
            h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
            h[156] = b'0';
            h[257..263].copy_from_slice(b"ustar\0");
            h[263..265].copy_from_slice(b"00");
            h[148..156].copy_from_slice(b"        ");
            let sum: u32 = h.iter().map(|&b| b as u32).sum();
            h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
            f.write_all(&h).unwrap();
            f.write_all(&vec![7u8; *size]).unwrap();
            f.write_all(&vec![0u8; size.div_ceil(512) * 512 - size]).unwrap();
        }
        f.write_all(&[0u8; 1024]).unwrap();
    }

    fn step(reads: &[(u32, u64, u64)]) -> Step {
        Step {
            reads: reads
                .iter()
                .map(|&(reader, offset, len)| Read { file: 0, offset, len, reader, mapped: false, cpu_after_ns: 0 })
                .collect(),
            bytes: reads.iter().map(|r| r.2).sum(),
            samples: 1,
            first_read_ns: 0,
            ready_ns: 0,
            interval_s: None,
            wait_s: 0.0,
            period_s: None,
            worker_cpu_s: None,
            taken: true,
        }
    }

    #[test]
    fn a_steps_samples_are_the_members_its_reads_completed() {
        let dir = std::env::temp_dir().join(format!("trainio-shards-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("shard-000000.tar");
        // Six samples of two members each (a label and an image), 1000 and 3000 bytes:
        // every sample takes 512 + 1024 + 512 + 3072 = 5120 bytes of the archive.
        let names: Vec<(String, usize)> =
            (0..6).flat_map(|i| [(format!("s{i:03}.cls"), 1000), (format!("s{i:03}.jpg"), 3000)]).collect();
        let members: Vec<(&str, usize)> = names.iter().map(|(n, s)| (n.as_str(), *s)).collect();
        tar(&path, &members);
        let ends = sample_ends(&path).unwrap();
        assert_eq!(ends.len(), 6);
        assert_eq!(ends[0], 512 + 1024 + 512 + 3000);
        // One reader streams the shard in records of 10240 bytes: two samples per record.
        let files = vec![(path.to_string_lossy().into_owned(), 0)];
        let mut steps = vec![step(&[(0, 0, 10240)]), step(&[(0, 10240, 10240)]), step(&[(0, 20480, 10240)])];
        let (shards, unreadable) = recount(&mut steps, &files);
        assert_eq!((shards, unreadable.len()), (1, 0));
        assert_eq!(steps.iter().map(|s| s.samples).collect::<Vec<_>>(), vec![2, 2, 2]);
        // Reads that stop inside a sample leave it to the step that completes it.
        let mut steps = vec![step(&[(0, 0, 6000)]), step(&[(0, 6000, 30720 - 6000)])];
        recount(&mut steps, &files);
        assert_eq!(steps.iter().map(|s| s.samples).collect::<Vec<_>>(), vec![1, 5]);
        std::fs::remove_dir_all(&dir).unwrap();
        // A shard that is not here keeps the counts it had, and is named.
        let mut steps = vec![step(&[(0, 0, 10240)])];
        let (shards, unreadable) = recount(&mut steps, &files);
        assert_eq!((shards, unreadable.len(), steps[0].samples), (0, 1, 1));
    }

    #[test]
    fn keys_group_members_as_webdataset_does() {
        assert_eq!(sample_key("train/000123.seg.png"), "train/000123");
        assert_eq!(sample_key("000123.x"), "000123");
        assert_eq!(sample_key("noext"), "noext");
    }
}
