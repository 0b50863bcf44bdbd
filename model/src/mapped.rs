//! Reads through memory mappings as the model's data reads. A process that reads a file
//! through mmap (HF `datasets`' Arrow files, `numpy.memmap`) makes no read syscalls: its
//! file layer has `fault` and `map_pages` rows (traces/SCHEMA.md, *mapped reads*), each a
//! page or a fault-around range of pages that became readable to it. The model counts
//! them as reads: each row is turned into a `read` row of the pages it made readable for
//! the first time in the process's mapping of the file, so a page is counted once however
//! many fault-arounds cover it, and again after the process maps the file anew (`mmap`).
//! A fault that maps a large folio makes the folio's other pages readable without a row:
//! the bytes counted are where the process faulted, a lower bound of what it read.
//!
//! The rows made here have `fd` null (a read syscall's never has), which is how replay
//! tells them from read syscalls.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use trainio_schema::OwnedRow;

const PAGE: i64 = 4096;
/// `mmap` rows' flags: prot in the low byte (traces/SCHEMA.md).
const PROT_EXEC: u32 = 4;
const PROT_WRITE: u32 = 2;

/// Whether a file-layer row is a mapped read (`fault` or `map_pages`).
pub fn is_mapped(r: &OwnedRow) -> bool {
    matches!(&*r.op, "fault" | "map_pages")
}

/// Whether a `read` row is one [`reads`] made from mapped reads.
pub fn is_mapped_read(r: &OwnedRow) -> bool {
    &*r.op == "read" && r.fd.is_none()
}

/// One process's mapping of one file: (pid, dev, file).
type MappingKey = (u32, Option<Arc<str>>, Option<Arc<str>>);

/// Pages of one process's mapping of one file already counted: a bit per page.
#[derive(Default)]
struct Seen(Vec<u64>);

impl Seen {
    /// Marks pages [first, last] and returns those that were not marked, as runs of
    /// (first page, pages).
    fn mark(&mut self, first: u64, last: u64) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let need = (last / 64 + 1) as usize;
        if self.0.len() < need {
            self.0.resize(need, 0);
        }
        for p in first..=last {
            let (w, b) = ((p / 64) as usize, p % 64);
            if self.0[w] & (1 << b) == 0 {
                self.0[w] |= 1 << b;
                match runs.last_mut() {
                    Some((s, n)) if *s + *n == p => *n += 1,
                    _ => runs.push((p, 1)),
                }
            }
        }
        runs
    }
}

/// A path that names code whatever mapping the trace saw: a shared object, or a file of
/// the system's program and library directories. The executable mapping of a library is
/// matched by path, and one file has several (`/lib/...` and `/usr/lib/...` on a merged
/// /usr; a launcher's symlink and the program it names), so a library whose PROT_EXEC
/// mapping was recorded under another name would otherwise count as data.
fn looks_like_code(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.ends_with(".so")
        || base.contains(".so.")
        || ["/bin/", "/sbin/", "/lib/", "/lib64/", "/lib32/", "/usr/bin/", "/usr/sbin/", "/usr/lib/", "/usr/libexec/"]
            .iter()
            .any(|d| path.starts_with(d))
}

/// The mappings the kernel made for the programs it started (`exec`): the program's file
/// and its interpreter's, mapped by the exec itself and never by an `mmap` of the process.
/// The trace names such a mapping by the file's own path (`/proc/PID/maps`), the exec by
/// the path it was run by (a symlink: `envs/x/bin/python` for `python3.11`, a directory
/// linked elsewhere), so the path alone does not match them.
struct KernelMapped<'a> {
    /// Each process's exec times, in order.
    execs: HashMap<u32, Vec<i64>>,
    /// Each process's own `mmap` times of each file.
    mmaps: HashMap<(u32, &'a str), Vec<i64>>,
}

impl<'a> KernelMapped<'a> {
    fn new(file: &'a [OwnedRow], proc_rows: &[OwnedRow]) -> Self {
        let mut execs: HashMap<u32, Vec<i64>> = HashMap::new();
        for r in proc_rows.iter().filter(|r| &*r.op == "exec") {
            execs.entry(r.pid).or_default().push(r.issue_ns);
        }
        let mut mmaps: HashMap<(u32, &str), Vec<i64>> = HashMap::new();
        for r in file.iter().filter(|r| &*r.op == "mmap" && r.error == 0) {
            if let Some(f) = r.file.as_deref() {
                mmaps.entry((r.pid, f)).or_default().push(r.issue_ns);
            }
        }
        for times in execs.values_mut() {
            times.sort_unstable();
        }
        KernelMapped { execs, mmaps }
    }

    /// Whether mapped row `r` is on a mapping its process's last exec made: the process
    /// was seen starting its program before `r`, and did not map `r`'s file itself since.
    /// A process forked without an exec (a DataLoader worker) keeps its parent's mappings,
    /// data included: it is never matched here.
    fn holds(&self, r: &OwnedRow) -> bool {
        let (Some(execs), Some(f)) = (self.execs.get(&r.pid), r.file.as_deref()) else { return false };
        let Some(&exec) = execs[..execs.partition_point(|&t| t <= r.issue_ns)].last() else { return false };
        !self.mmaps.get(&(r.pid, f)).is_some_and(|ts| ts.iter().any(|&t| t >= exec && t <= r.issue_ns))
    }
}

/// The `read` rows of a trace's mapped reads (`file`: its file-layer rows, any order): one
/// per run of newly readable pages, at the mapped row's time, in time order. Faults on
/// code are not data reads: on a file some process mapped executable (`mmap` with
/// PROT_EXEC: shared libraries) or executed (`exec` in `proc_rows`), on a mapping an exec
/// made (the program and its interpreter, whatever name they were run by), or on a file
/// the recorder could not name; nor are faults on a file some process mapped writable
/// (memory shared between processes).
pub fn reads(file: &[OwnedRow], proc_rows: &[OwnedRow]) -> Vec<OwnedRow> {
    if !file.iter().any(is_mapped) {
        return Vec::new();
    }
    // Code, and memory shared between processes (a writable mapping: MPI's PMIx and
    // hwloc segments in /tmp), are not a dataset.
    let code: HashSet<&str> = file
        .iter()
        .filter(|r| &*r.op == "mmap" && r.flags & (PROT_EXEC | PROT_WRITE) != 0)
        .chain(proc_rows.iter().filter(|r| &*r.op == "exec"))
        .filter_map(|r| r.file.as_deref())
        .collect();
    let kernel_mapped = KernelMapped::new(file, proc_rows);
    let mut rows: Vec<&OwnedRow> = file
        .iter()
        .filter(|r| is_mapped(r) || (&*r.op == "mmap" && r.error == 0))
        // A mapping whose file the recorder could not name (mapped before the recording,
        // the loader's own view of an executable) is not a data file the replay could
        // lay out: left out with code.
        .filter(|r| r.file.as_deref().is_some_and(|f| !code.contains(f) && !looks_like_code(f)))
        .filter(|r| !(is_mapped(r) && kernel_mapped.holds(r)))
        .collect();
    rows.sort_by_key(|r| (r.issue_ns, r.tid));
    let mut seen: HashMap<MappingKey, Seen> = HashMap::new();
    let mut out = Vec::new();
    for r in rows {
        let key = (r.pid, r.dev.clone(), r.file.clone());
        if &*r.op == "mmap" {
            seen.remove(&key);
            continue;
        }
        let (Some(offset), true) = (r.offset, r.bytes_requested > 0) else { continue };
        if offset < 0 {
            continue;
        }
        let first = (offset / PAGE) as u64;
        let last = ((offset + r.bytes_requested - 1) / PAGE) as u64;
        for (page, pages) in seen.entry(key).or_default().mark(first, last) {
            let bytes = pages as i64 * PAGE;
            out.push(OwnedRow {
                op: Arc::from("read"),
                offset: Some(page as i64 * PAGE),
                bytes,
                bytes_requested: bytes,
                fd: None,
                queue_depth: 0,
                ..r.clone()
            });
        }
    }
    out
}
