//! Turns raw ring-buffer records into trace rows. Runs on the drain path: no allocation
//! per event except the first time a device, process or fd is seen.
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use trainio_schema::{dev_string, BatchBuilder, Layer, ObjectFields, Row, RowKeys, Rpc};

use crate::bpf::{block_event, file_event, http_event, ipc_event, nfs_event, open_event, process_event};
use crate::bpf::{trainio_file_op as fop, trainio_kind as kind, trainio_nfs_op as nfsop, trainio_rpc_flags as rpcf};
use crate::bpf::{trainio_ipc_op as ipcop, trainio_ipc_type as ipct, trainio_proc_op as procop};
use crate::host::ProcInfo;
use crate::object::{ObjectRequest, ObjectTracker, SocketIo};

/// Rows per batch: the drain loop (record.rs) hands the collector's batch to the encoder
/// at this many rows, and the encoder sizes its queue by it. Small batches keep the rows
/// in the caches between the two threads and the encoder's bursts short: 64 Ki-row
/// batches (~5 MB of columns) cost the traced job ~3 points of IOPS more than 4 Ki
/// (docs/design/recorder.md).
pub const FLUSH_ROWS: usize = 4 * 1024;

const KIND_BLOCK: u32 = kind::TRAINIO_KIND_BLOCK.0;
const KIND_FILE: u32 = kind::TRAINIO_KIND_FILE.0;
const KIND_OPEN: u32 = kind::TRAINIO_KIND_OPEN.0;
const KIND_NFS: u32 = kind::TRAINIO_KIND_NFS.0;
const KIND_BLOCK_BATCH: u32 = kind::TRAINIO_KIND_BLOCK_BATCH.0;
const KIND_PROC: u32 = kind::TRAINIO_KIND_PROC.0;
const KIND_IPC: u32 = kind::TRAINIO_KIND_IPC.0;
const KIND_HTTP: u32 = kind::TRAINIO_KIND_HTTP.0;
const KIND_TLS: u32 = kind::TRAINIO_KIND_TLS.0;
const FOP_CLOSE: u32 = fop::TRAINIO_FOP_CLOSE.0;
const FOP_WRITE: u32 = fop::TRAINIO_FOP_WRITE.0;
const FOP_PWRITE64: u32 = fop::TRAINIO_FOP_PWRITE64.0;
const FOP_FSYNC: u32 = fop::TRAINIO_FOP_FSYNC.0;
const FOP_FDATASYNC: u32 = fop::TRAINIO_FOP_FDATASYNC.0;
const FOP_SYNC_FILE_RANGE: u32 = fop::TRAINIO_FOP_SYNC_FILE_RANGE.0;
const FOP_URING_WRITE: u32 = fop::TRAINIO_FOP_URING_WRITE.0;
const FOP_WRITEV: u32 = fop::TRAINIO_FOP_WRITEV.0;
const FOP_PWRITEV: u32 = fop::TRAINIO_FOP_PWRITEV.0;
const FOP_PWRITEV2: u32 = fop::TRAINIO_FOP_PWRITEV2.0;
const FOP_FAULT: u32 = fop::TRAINIO_FOP_FAULT.0;
const FOP_MAP_PAGES: u32 = fop::TRAINIO_FOP_MAP_PAGES.0;
const FOP_MMAP: u32 = fop::TRAINIO_FOP_MMAP.0;
const FOP_MADVISE: u32 = fop::TRAINIO_FOP_MADVISE.0;

const AT_FDCWD: i32 = -100;
const REQ_OP_MASK: u32 = 0xff;
const REQ_OP_READ: u32 = 0;
const REQ_OP_WRITE: u32 = 1;
const REQ_OP_FLUSH: u32 = 2;

/// Per layer and device: what the summary prints and the metadata counts.
#[derive(Default, Clone, Copy, Debug)]
pub struct Tally {
    pub events: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

pub struct Collector {
    pub batch: BatchBuilder,
    devs: FxHashMap<u32, Box<str>>,
    /// (tgid, fd) → path, from openat, or from /proc when the fd predates the recording.
    fds: HashMap<(u32, i32), Option<Arc<str>>>,
    /// (kernel dev, inode) → path of files opened while tracing (inode 0: a block device
    /// node, named by its device). Names reads on dup'ed or inherited fds, and NFS rows.
    inodes: HashMap<(u32, u64), Arc<str>>,
    cwds: HashMap<u32, PathBuf>,
    /// Processes whose /proc/PID/maps was read into `inodes` (to name the files of page
    /// faults on mappings made before the recording started): once each.
    maps_read: FxHashMap<u32, ()>,
    /// (trainio_ipc_type, inode) → `pipe:[INO]` / `socket:[INO]`.
    ipc_names: FxHashMap<(u32, u64), Arc<str>>,
    /// Per (layer, kernel dev; 0 = none): counted per event, so keyed by integers.
    tallies: FxHashMap<(Layer, u32), Tally>,
    /// The tally counted last (rows come in runs of one layer and device), kept out of
    /// `tallies` while it is the current one.
    last_tally: Option<((Layer, u32), Tally)>,
    /// The last block row's comm: raw bytes as a number, and as a string (initially the
    /// all-zero comm, which is "").
    last_comm: (u128, Box<str>),
    /// The last block row's device: kernel dev_t and MAJ:MIN (dev 0: none), so that a run
    /// of one device skips the map lookup.
    last_dev: (u32, Option<Box<str>>),
    /// The object layer's requests in progress, per connection (object.rs).
    objects: ObjectTracker,
    /// Requests the tracker finished, written as rows at once (kept to reuse its buffer).
    finished: Vec<ObjectRequest>,
    /// Each live traced process's cgroup as its last `cgroup` row gave it.
    cgroups: FxHashMap<u32, Box<str>>,
    pub undecodable: u64,
}

fn comm_str(comm: &[i8; 16]) -> &str {
    // SAFETY: i8 and u8 have the same layout.
    let bytes: &[u8; 16] = unsafe { &*(comm as *const [i8; 16] as *const [u8; 16]) };
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    std::str::from_utf8(&bytes[..end]).unwrap_or("?")
}

/// Request op as REQ_OP_* (include/linux/blk_types.h) names it.
fn block_op(cmd_flags: u32) -> &'static str {
    match cmd_flags & REQ_OP_MASK {
        REQ_OP_READ => "read",
        REQ_OP_WRITE => "write",
        REQ_OP_FLUSH => "flush",
        3 | 5 => "discard", // DISCARD, SECURE_ERASE
        9 => "write_zeroes",
        _ => "other",
    }
}

/// blk_status_t → -errno, as the kernel's blk_errors table maps them.
fn blk_status_errno(status: i32) -> i32 {
    -match status {
        0 => 0,
        1 => libc::EOPNOTSUPP,
        2 => libc::ETIMEDOUT,
        3 => libc::ENOSPC,
        4 => libc::ENOLINK,
        5 => libc::EREMOTEIO,
        6 => libc::EBADE,
        7 => libc::ENODATA,
        8 => libc::EILSEQ,
        9 => libc::ENOMEM,
        11 => libc::EREMCHG,
        12 => libc::EAGAIN,
        13 => libc::EBUSY,
        14 => libc::ETOOMANYREFS,
        15 => libc::EOVERFLOW,
        16 => libc::ENODEV,
        17 => libc::ETIME,
        _ => libc::EIO,
    }
}

/// MAJ:MIN of a kernel dev_t (0: none), formatted once per device.
fn dev_name(devs: &mut FxHashMap<u32, Box<str>>, kernel_dev: u32) -> Option<&str> {
    (kernel_dev != 0).then(|| &**devs.entry(kernel_dev).or_insert_with(|| dev_string(kernel_dev).into()))
}

fn nonzero(ns: u64) -> Option<i64> {
    (ns != 0).then_some(ns as i64)
}

impl Collector {
    pub fn new() -> Self {
        Collector {
            // Headroom for the rows one turn of the drain loop adds past FLUSH_ROWS (~400
            // at 200k events/s, more after a stall): a column that outgrows its capacity
            // is copied whole.
            batch: BatchBuilder::with_capacity(2 * FLUSH_ROWS),
            devs: FxHashMap::default(),
            fds: HashMap::new(),
            inodes: HashMap::new(),
            cwds: HashMap::new(),
            maps_read: FxHashMap::default(),
            ipc_names: FxHashMap::default(),
            tallies: FxHashMap::default(),
            last_tally: None,
            last_comm: (0, "".into()),
            last_dev: (0, None),
            objects: ObjectTracker::new(),
            finished: Vec::new(),
            cgroups: FxHashMap::default(),
            undecodable: 0,
        }
    }

    /// Devices seen so far, as MAJ:MIN.
    pub fn devices(&self) -> impl Iterator<Item = &str> {
        self.devs.values().map(|d| &**d)
    }

    fn count(&mut self, layer: Layer, kernel_dev: u32, read: u64, written: u64) {
        let t = match &mut self.last_tally {
            Some((k, t)) if *k == (layer, kernel_dev) => t,
            last => {
                if let Some((k, t)) = last.take() {
                    self.tallies.insert(k, t);
                }
                let t = self.tallies.remove(&(layer, kernel_dev)).unwrap_or_default();
                &mut last.insert(((layer, kernel_dev), t)).1
            }
        };
        t.events += 1;
        t.bytes_read += read;
        t.bytes_written += written;
    }

    /// What was recorded per layer and device (MAJ:MIN), in a stable order.
    pub fn tally(&self) -> BTreeMap<(Layer, Option<String>), Tally> {
        self.tallies
            .iter()
            .chain(self.last_tally.iter().map(|(k, t)| (k, t)))
            .map(|(&(layer, d), t)| ((layer, (d != 0).then(|| dev_string(d))), *t))
            .collect()
    }

    /// Decodes one ring-buffer record. Returns 0 as libbpf's callback contract wants.
    pub fn on_record(&mut self, data: &[u8]) -> i32 {
        let tag = data.get(..4).map(|b| u32::from_ne_bytes(b.try_into().unwrap()));
        let decoded = match tag {
            Some(KIND_BLOCK) => plain::from_bytes::<block_event>(data).map(|e| self.block(e)).is_ok(),
            Some(KIND_BLOCK_BATCH) => self.block_batch(data),
            Some(KIND_FILE) => plain::from_bytes::<file_event>(data).map(|e| self.file(e)).is_ok(),
            Some(KIND_OPEN) => plain::from_bytes::<open_event>(data).map(|e| self.open(e)).is_ok(),
            Some(KIND_NFS) => plain::from_bytes::<nfs_event>(data).map(|e| self.nfs(e)).is_ok(),
            Some(KIND_PROC) => plain::from_bytes::<process_event>(data).map(|e| self.proc(e)).is_ok(),
            Some(KIND_IPC) => plain::from_bytes::<ipc_event>(data).map(|e| self.ipc(e)).is_ok(),
            Some(KIND_HTTP) => self.http(data, false),
            Some(KIND_TLS) => self.http(data, true),
            _ => false,
        };
        if !decoded {
            self.undecodable += 1;
        }
        0
    }

    /// An http_event record: the ipc row it carries, then the object layer's share (a
    /// record holds only its captured bytes of data[], trainio.h). A TLS call's record
    /// (`tls`) is plaintext over a socket whose syscalls are ipc rows of their own: no row.
    fn http(&mut self, data: &[u8], tls: bool) -> bool {
        let fixed = std::mem::offset_of!(http_event, data);
        let Some(ipc) =
            data.get(..std::mem::size_of::<ipc_event>()).and_then(|b| plain::from_bytes::<ipc_event>(b).ok())
        else {
            return false;
        };
        if data.len() < fixed {
            return false;
        }
        let at = |field: usize, n: usize| &data[field..field + n];
        let mut daddr = [0u8; 16];
        daddr.copy_from_slice(at(std::mem::offset_of!(http_event, daddr), 16));
        let u16_at = |field: usize| u16::from_ne_bytes(at(field, 2).try_into().unwrap());
        let captured = u32::from_ne_bytes(at(std::mem::offset_of!(http_event, captured), 4).try_into().unwrap());
        let Some(head) = data.get(fixed..fixed + captured as usize) else { return false };
        if !tls {
            self.ipc(ipc);
        }
        let io = SocketIo {
            write: ipc.op == ipcop::TRAINIO_IPC_WRITE.0,
            enter_ns: ipc.enter_ns as i64,
            exit_ns: ipc.exit_ns as i64,
            ret: ipc.ret,
            ino: ipc.ino,
            pid: ipc.pid,
            tid: ipc.tid,
            fd: ipc.fd,
            comm: comm_str(&ipc.comm),
            family: u16_at(std::mem::offset_of!(http_event, family)),
            daddr,
            dport: u16_at(std::mem::offset_of!(http_event, dport)),
            head,
            tls,
        };
        let mut done = std::mem::take(&mut self.finished);
        self.objects.on_io(&io, &mut done);
        self.push_objects(&mut done);
        self.finished = done;
        true
    }

    /// Writes the object requests still open (at the end of a recording) as incomplete rows.
    pub fn finish_objects(&mut self) {
        let mut done = std::mem::take(&mut self.finished);
        self.objects.finish_all(&mut done);
        self.push_objects(&mut done);
        self.finished = done;
    }

    fn push_objects(&mut self, done: &mut Vec<ObjectRequest>) {
        for r in done.drain(..) {
            self.batch.push_object(
                &Row {
                    layer: Layer::Object,
                    op: r.op,
                    issue_ns: r.issue_ns,
                    complete_ns: r.complete_ns,
                    insert_ns: None,
                    dev: None,
                    offset: r.offset,
                    bytes: r.bytes,
                    bytes_requested: r.bytes_requested,
                    queue_depth: r.queue_depth,
                    pid: r.pid,
                    tid: r.tid,
                    comm: &r.comm,
                    fd: Some(r.fd),
                    file: Some(&r.key),
                    error: r.error,
                    flags: 0,
                    ppid: None,
                },
                &ObjectFields { endpoint: &r.endpoint, http_status: r.http_status, first_byte_ns: r.first_byte_ns },
            );
            let (read, written) = if matches!(r.op, "put" | "post") { (0, r.bytes) } else { (r.bytes, 0) };
            self.count(Layer::Object, 0, read.max(0) as u64, written.max(0) as u64);
        }
    }

    /// A block_batch record: an 8-byte header (kind, count), then `count` block_events.
    fn block_batch(&mut self, data: &[u8]) -> bool {
        const EV: usize = std::mem::size_of::<block_event>();
        let Some(count) = data.get(4..8).map(|b| u32::from_ne_bytes(b.try_into().unwrap()) as usize) else {
            return false;
        };
        let Some(events) = data.get(8..8 + count * EV) else { return false };
        for chunk in events.chunks_exact(EV) {
            match plain::from_bytes::<block_event>(chunk) {
                Ok(e) => self.block(e),
                Err(_) => return false,
            }
        }
        true
    }

    fn block(&mut self, e: &block_event) {
        let op = block_op(e.cmd_flags);
        if self.last_dev.0 != e.dev {
            self.last_dev = (e.dev, dev_name(&mut self.devs, e.dev).map(Box::from));
        }
        let dev = self.last_dev.1.as_deref();
        // The command as a number: consecutive rows mostly share it (one issuer), and
        // the string is then neither re-validated nor compared.
        // SAFETY: [i8; 16] and [u8; 16] have the same layout.
        let comm_key = u128::from_ne_bytes(unsafe { *(&e.comm as *const [i8; 16] as *const [u8; 16]) });
        if self.last_comm.0 != comm_key {
            self.last_comm = (comm_key, comm_str(&e.comm).into());
        }
        let opc = e.cmd_flags & REQ_OP_MASK;
        let offset = (opc != REQ_OP_FLUSH && e.sector != u64::MAX).then(|| (e.sector * 512) as i64);
        let bytes = e.bytes as i64;
        self.batch.push_keyed(
            &Row {
                layer: Layer::Block,
                op,
                issue_ns: e.issue_ns as i64,
                complete_ns: e.complete_ns as i64,
                insert_ns: nonzero(e.insert_ns),
                dev,
                offset,
                bytes,
                bytes_requested: bytes,
                queue_depth: e.queue_depth,
                pid: e.pid,
                tid: e.tid,
                comm: &self.last_comm.1,
                fd: None,
                file: None,
                error: blk_status_errno(e.error),
                flags: e.cmd_flags & !REQ_OP_MASK,
                ppid: None,
            },
            RowKeys { op: e.cmd_flags & REQ_OP_MASK, dev: e.dev, comm: comm_key },
        );
        let (r, w) = match opc {
            REQ_OP_READ => (e.bytes as u64, 0),
            REQ_OP_WRITE => (0, e.bytes as u64),
            _ => (0, 0),
        };
        self.count(Layer::Block, e.dev, r, w);
    }

    fn cwd(&mut self, pid: u32) -> Option<PathBuf> {
        if let Some(c) = self.cwds.get(&pid) {
            return Some(c.clone());
        }
        let c = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
        self.cwds.insert(pid, c.clone());
        Some(c)
    }

    /// The path of an fd: as it was opened while we traced, else what /proc says now.
    fn fd_path(&mut self, pid: u32, fd: i32) -> Option<Arc<str>> {
        self.fds
            .entry((pid, fd))
            .or_insert_with(|| {
                std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok().map(|p| Arc::from(p.to_string_lossy().as_ref()))
            })
            .clone()
    }

    /// The path of a file a process maps, from what it opened or mmap'ed while traced,
    /// else from its /proc/PID/maps (read once per process).
    fn mapped_path(&mut self, pid: u32, kernel_dev: u32, ino: u64) -> Option<Arc<str>> {
        if let Some(p) = self.inodes.get(&(kernel_dev, ino)) {
            return Some(p.clone());
        }
        if self.maps_read.insert(pid, ()).is_none() {
            if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) {
                for (dev, ino, path) in parse_maps(&text) {
                    self.inodes.entry((dev, ino)).or_insert_with(|| Arc::from(path));
                }
            }
        }
        self.inodes.get(&(kernel_dev, ino)).cloned()
    }

    fn file(&mut self, e: &file_event) {
        let (op, read) = match e.op {
            FOP_FAULT => ("fault", true),
            FOP_MAP_PAGES => ("map_pages", false),
            FOP_MMAP => ("mmap", false),
            FOP_MADVISE => ("madvise", false),
            FOP_CLOSE => ("close", false),
            FOP_WRITE | FOP_PWRITE64 | FOP_URING_WRITE | FOP_WRITEV | FOP_PWRITEV | FOP_PWRITEV2 => ("write", false),
            FOP_FSYNC => ("fsync", false),
            FOP_FDATASYNC => ("fdatasync", false),
            FOP_SYNC_FILE_RANGE => ("sync_file_range", false),
            _ => ("read", true),
        };
        // Closes, syncs, mmap and madvise move no data: bytes 0, counted as events only.
        // A fault-around's bytes are its range (rows of pages, as a fault's), not read.
        let moves_data = matches!(op, "read" | "write" | "fault" | "map_pages");
        let file = match self.inodes.get(&(e.dev, e.ino)) {
            Some(p) => Some(p.clone()),
            None if e.fd < 0 => self.mapped_path(e.pid, e.dev, e.ino),
            None => {
                let p = self.fd_path(e.pid, e.fd);
                // A file mmap'ed from an fd opened before the recording: its faults need it.
                if let (Some(p), FOP_MMAP) = (&p, e.op) {
                    self.inodes.insert((e.dev, e.ino), p.clone());
                }
                p
            }
        };
        let dev = dev_name(&mut self.devs, e.dev);
        let done = e.ret.max(0);
        self.batch.push(&Row {
            layer: Layer::File,
            op,
            issue_ns: e.enter_ns as i64,
            complete_ns: e.exit_ns as i64,
            insert_ns: None,
            dev,
            offset: (op != "close" && e.offset >= 0).then_some(e.offset),
            bytes: if moves_data { done } else { 0 },
            // mmap returns an address: only a negative errno is an error.
            error: if e.ret < 0 && e.ret >= -4095 { e.ret as i32 } else { 0 },
            bytes_requested: e.requested as i64,
            queue_depth: e.queue_depth,
            pid: e.pid,
            tid: e.tid,
            comm: comm_str(&e.comm),
            fd: (e.fd >= 0 || !matches!(op, "fault" | "map_pages" | "madvise")).then_some(e.fd),
            file: file.as_deref(),
            flags: e.flags,
            ppid: None,
        });
        if op == "close" {
            self.fds.remove(&(e.pid, e.fd));
        }
        if !moves_data || op == "map_pages" {
            self.count(Layer::File, e.dev, 0, 0);
        } else if read {
            self.count(Layer::File, e.dev, done as u64, 0);
        } else {
            self.count(Layer::File, e.dev, 0, done as u64);
        }
    }

    fn open(&mut self, e: &open_event) {
        // SAFETY: i8 and u8 have the same layout.
        let raw: &[u8] = unsafe { &*(&e.path[..] as *const [i8] as *const [u8]) };
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        let given = String::from_utf8_lossy(&raw[..end]);
        let path: Option<Arc<str>> = if given.is_empty() {
            None
        } else if given.starts_with('/') {
            Some(Arc::from(given.as_ref()))
        } else {
            let base = if e.dirfd == AT_FDCWD {
                self.cwd(e.pid)
            } else {
                self.fd_path(e.pid, e.dirfd).map(|p| PathBuf::from(&*p))
            };
            Some(match base {
                Some(b) => Arc::from(Path::new(&b).join(given.as_ref()).to_string_lossy().as_ref()),
                None => Arc::from(given.as_ref()),
            })
        };
        let fd = (e.ret >= 0).then_some(e.ret);
        if let Some(fd) = fd {
            self.fds.insert((e.pid, fd), path.clone());
            if let (Some(p), true) = (&path, e.dev != 0) {
                self.inodes.insert((e.dev, e.ino), p.clone());
            }
        }
        self.batch.push(&Row {
            layer: Layer::File,
            op: "open",
            issue_ns: e.enter_ns as i64,
            complete_ns: e.exit_ns as i64,
            insert_ns: None,
            dev: None,
            offset: None,
            bytes: 0,
            bytes_requested: 0,
            queue_depth: 0,
            pid: e.pid,
            tid: e.tid,
            comm: comm_str(&e.comm),
            fd,
            file: path.as_deref(),
            error: e.ret.min(0),
            flags: e.flags,
            ppid: None,
        });
        self.count(Layer::File, 0, 0, 0);
    }

    fn nfs(&mut self, e: &nfs_event) {
        let op = match e.op {
            x if x == nfsop::TRAINIO_NFS_READ.0 => "read",
            x if x == nfsop::TRAINIO_NFS_WRITE.0 => "write",
            _ => "commit",
        };
        let dev = dev_name(&mut self.devs, e.dev);
        let file = self.inodes.get(&(e.dev, e.fileid)).cloned();
        let rpc = (e.rpc & rpcf::TRAINIO_RPC_STATS.0 != 0).then(|| Rpc {
            xid: e.rpc_xid,
            backlog_ns: (e.rpc_backlog_us as i64).saturating_mul(1000),
            rtt_ns: (e.rpc_rtt_us as i64).saturating_mul(1000),
            execute_ns: (e.rpc_execute_us as i64).saturating_mul(1000),
            retrans: (e.rpc & rpcf::TRAINIO_RPC_NTRANS.0 != 0).then(|| e.rpc_ntrans.saturating_sub(1)),
        });
        self.batch.push_rpc(
            &Row {
                layer: Layer::Nfs,
                op,
                issue_ns: e.issue_ns as i64,
                complete_ns: e.complete_ns as i64,
                insert_ns: None,
                dev,
                offset: Some(e.offset),
                bytes: e.returned as i64,
                bytes_requested: e.requested as i64,
                queue_depth: e.queue_depth,
                pid: e.pid,
                tid: e.tid,
                comm: comm_str(&e.comm),
                fd: None,
                file: file.as_deref(),
                error: e.error,
                flags: 0,
                ppid: None,
            },
            rpc.as_ref(),
        );
        let (r, w) = match op {
            "read" => (e.returned as u64, 0),
            "write" => (0, e.returned as u64),
            _ => (0, 0),
        };
        self.count(Layer::Nfs, e.dev, r, w);
    }

    /// A `start` row: a traced process that existed when the recording started, as /proc
    /// described it then (user space, not a probe, reports these).
    pub fn proc_start(&mut self, p: &ProcInfo, ns: i64) {
        let file = (!p.cmdline.is_empty()).then_some(p.cmdline.as_str());
        self.push_proc("start", ns, (p.pid, p.pid, p.ppid), &p.comm, file, 0);
        self.push_cgroup(ns, (p.pid, p.ppid), &p.comm);
    }

    /// A `cgroup` row after a process's `start`, `fork` or `exec` row when its cgroup,
    /// as /proc/PID/cgroup gives it now (as the metrics' `cgroup` label names it), is not
    /// the one its last cgroup row gave: a container runtime moves its process into the
    /// pod's cgroup, then executes the entrypoint. None when the process is already gone.
    fn push_cgroup(&mut self, ns: i64, ids: (u32, u32), comm: &str) {
        let Some(path) = crate::host::cgroup_of(ids.0) else { return };
        if self.cgroups.get(&ids.0).is_some_and(|c| **c == *path) {
            return;
        }
        self.push_proc("cgroup", ns, (ids.0, ids.0, ids.1), comm, Some(&path), 0);
        self.cgroups.insert(ids.0, path.into());
    }

    fn proc(&mut self, e: &process_event) {
        let op = match e.op {
            x if x == procop::TRAINIO_PROC_FORK.0 => "fork",
            x if x == procop::TRAINIO_PROC_EXEC.0 => "exec",
            x if x == procop::TRAINIO_PROC_COMM.0 => "comm",
            _ => "exit",
        };
        // SAFETY: i8 and u8 have the same layout.
        let raw: &[u8] = unsafe { &*(&e.file[..] as *const [i8] as *const [u8]) };
        let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
        let file = (op == "exec").then(|| String::from_utf8_lossy(&raw[..end]));
        let code = if op == "exit" { e.exit_code } else { 0 };
        self.push_proc(op, e.ns as i64, (e.pid, e.tid, e.ppid), comm_str(&e.comm), file.as_deref(), code);
        match op {
            "fork" | "exec" => self.push_cgroup(e.ns as i64, (e.pid, e.ppid), comm_str(&e.comm)),
            "exit" => {
                self.cgroups.remove(&e.pid);
            }
            _ => {}
        }
    }

    /// One proc-layer row: an instant, `ids` = (pid, tid, ppid), `error` the exit status.
    fn push_proc(&mut self, op: &str, ns: i64, ids: (u32, u32, u32), comm: &str, file: Option<&str>, error: i32) {
        let (pid, tid, ppid) = ids;
        self.batch.push(&Row {
            layer: Layer::Proc,
            op,
            issue_ns: ns,
            complete_ns: ns,
            insert_ns: None,
            dev: None,
            offset: None,
            bytes: 0,
            bytes_requested: 0,
            queue_depth: 0,
            pid,
            tid,
            comm,
            fd: None,
            file,
            error,
            flags: 0,
            ppid: Some(ppid),
        });
        self.count(Layer::Proc, 0, 0, 0);
    }

    fn ipc(&mut self, e: &ipc_event) {
        let op = match e.op {
            x if x == ipcop::TRAINIO_IPC_WRITE.0 => "write",
            x if x == ipcop::TRAINIO_IPC_WAIT.0 => "wait",
            _ => "read",
        };
        // As /proc/PID/fd names them; one string per inode, formatted once.
        let what = if e.ipc == ipct::TRAINIO_IPC_SOCKET.0 { "socket" } else { "pipe" };
        let name = self.ipc_names.entry((e.ipc, e.ino)).or_insert_with(|| format!("{what}:[{}]", e.ino).into()).clone();
        let dev = dev_name(&mut self.devs, e.dev);
        let done = e.ret.max(0);
        self.batch.push(&Row {
            layer: Layer::Ipc,
            op,
            issue_ns: e.enter_ns as i64,
            complete_ns: e.exit_ns as i64,
            insert_ns: None,
            dev,
            offset: None,
            bytes: done,
            bytes_requested: e.requested as i64,
            queue_depth: 0,
            pid: e.pid,
            tid: e.tid,
            comm: comm_str(&e.comm),
            fd: Some(e.fd),
            file: Some(&name),
            error: if e.ret < 0 { e.ret as i32 } else { 0 },
            flags: 0,
            ppid: None,
        });
        match op {
            "read" => self.count(Layer::Ipc, e.dev, done as u64, 0),
            "write" => self.count(Layer::Ipc, e.dev, 0, done as u64),
            _ => self.count(Layer::Ipc, e.dev, 0, 0),
        }
    }
}

/// (kernel dev, inode, path) of each file mapping in a /proc/PID/maps text
/// (`start-end perms offset MAJ:MIN inode path`, MAJ and MIN in hex).
fn parse_maps(text: &str) -> impl Iterator<Item = (u32, u64, &str)> {
    text.lines().filter_map(|line| {
        let mut f = line.splitn(6, ' ');
        let (_, _, _, dev, ino) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let path = f.next()?.trim_start();
        let ino: u64 = ino.parse().ok()?;
        let (maj, min) = dev.split_once(':')?;
        let (maj, min) = (u32::from_str_radix(maj, 16).ok()?, u32::from_str_radix(min, 16).ok()?);
        (ino != 0 && path.starts_with('/')).then_some(((maj << 20) | min, ino, path))
    })
}

#[cfg(test)]
mod tests {
    use super::{block_event, parse_maps, Collector, Layer, KIND_BLOCK, KIND_BLOCK_BATCH};

    #[test]
    fn maps_lines_give_the_device_inode_and_path_of_file_mappings() {
        let text = "55d0c0a00000-55d0c0a28000 r--p 00000000 fd:01 1311234                    /usr/bin/python3.11\n\
                    7f10a0000000-7f10a4000000 r--s 00000000 07:03 12                         /mnt/data/a b.npy\n\
                    7f10a8000000-7f10a8021000 rw-p 00000000 00:00 0 \n\
                    7ffd1c9e0000-7ffd1ca01000 rw-p 00000000 00:00 0                          [stack]\n";
        let got: Vec<_> = parse_maps(text).collect();
        assert_eq!(got, [((0xfd << 20) | 1, 1311234, "/usr/bin/python3.11"), ((7 << 20) | 3, 12, "/mnt/data/a b.npy")]);
    }

    fn event(i: u32, comm: &str) -> block_event {
        let mut e = block_event {
            kind: KIND_BLOCK,
            dev: (7 << 20) | 3,
            issue_ns: 1000 + i as u64,
            complete_ns: 2000 + i as u64,
            sector: 8 * i as u64,
            bytes: 4096,
            queue_depth: i + 1,
            pid: 42,
            tid: 43,
            ..Default::default()
        };
        for (d, s) in e.comm.iter_mut().zip(comm.bytes()) {
            *d = s as i8;
        }
        e
    }

    /// A block_batch record as the kernel writes it: kind, count, then the events.
    fn batch(events: &[block_event]) -> Vec<u8> {
        let mut rec = Vec::new();
        rec.extend_from_slice(&KIND_BLOCK_BATCH.to_ne_bytes());
        rec.extend_from_slice(&(events.len() as u32).to_ne_bytes());
        for e in events {
            // SAFETY: block_event is plain old data.
            rec.extend_from_slice(unsafe { plain::as_bytes(e) });
        }
        rec
    }

    #[test]
    fn a_batch_record_gives_one_row_per_event_in_order() {
        let mut c = Collector::new();
        let events: Vec<_> = (0..5).map(|i| event(i, if i < 3 { "fio" } else { "kworker/0:1" })).collect();
        // The kernel writes only the filled part of a batch: 8 + count * size bytes.
        assert_eq!(c.on_record(&batch(&events)), 0);
        assert_eq!(c.undecodable, 0);
        let b = c.batch.finish();
        assert_eq!(b.num_rows(), 5);
        let q = b.column_by_name("queue_depth").unwrap().as_any().downcast_ref::<arrow_array::UInt32Array>().unwrap();
        assert_eq!(q.values().to_vec(), vec![1, 2, 3, 4, 5]);
        let comm = b.column_by_name("comm").unwrap().as_any();
        let comm = comm.downcast_ref::<arrow_array::DictionaryArray<arrow_array::types::Int32Type>>().unwrap();
        let comm = comm.downcast_dict::<arrow_array::StringArray>().unwrap();
        assert_eq!(comm.into_iter().flatten().collect::<Vec<_>>(), ["fio", "fio", "fio", "kworker/0:1", "kworker/0:1"]);
        let t = &c.tally()[&(Layer::Block, Some("7:3".to_string()))];
        assert_eq!((t.events, t.bytes_read), (5, 5 * 4096));
    }

    #[test]
    fn a_short_batch_record_is_undecodable_not_misread() {
        let mut c = Collector::new();
        let mut rec = batch(&[event(0, "a"), event(1, "b")]);
        rec.truncate(rec.len() - 1);
        c.on_record(&rec);
        assert_eq!((c.undecodable, c.batch.len()), (1, 0));
    }
}
