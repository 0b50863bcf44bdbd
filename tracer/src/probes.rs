//! BPF lifecycle: open → configure (rodata, map sizes, autoload) → load → attach, with
//! each step's failure named. Probes the kernel lacks are switched off before load (one
//! program that fails to load fails its whole object) and reported as skipped.
use std::collections::{BTreeMap, HashSet};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use anyhow::{bail, Context, Result};
use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder};
use serde::Serialize;

use crate::bpf::{BlockSkel, BlockSkelBuilder, FileSkel, FileSkelBuilder, NfsSkel, NfsSkelBuilder};
use crate::host;

mod tls;
pub use tls::mapped_libssl;
use tls::{attach_tls, is_uprobe, tls_libraries};

/// Which processes the file layer follows (must match TARGET_* in file.bpf.c).
#[derive(Clone, Debug)]
pub enum Target {
    All,
    /// tgids seeded by user space, followed through fork.
    Tgids,
    /// A cgroup-v2 (id, level below the root): its tasks and those of its descendants.
    Cgroup(u64, u32),
}

pub struct Settings {
    pub block: bool,
    pub file: bool,
    pub nfs: bool,
    /// The object layer: sends and receives on TCP sockets carry their HTTP heads.
    pub object: bool,
    pub devs: Vec<u32>,
    pub ringbuf_bytes: u32,
    pub target: Target,
    pub bpf_stats: bool,
    /// Also record io_uring reads and writes at the file layer (file.bpf.c).
    pub io_uring: bool,
    /// libssl files to probe besides the linker cache's (--tls-lib, the --pid target's).
    pub tls_libs: Vec<std::path::PathBuf>,
}

/// Names of the lost-event counters, by index (enum trainio_lost in bpf/trainio.h).
const LOST_NAMES: [&str; 13] = [
    "block_rq_complete:ringbuf_full",
    "block_rq_issue:map_full",
    "file_syscall_exit:ringbuf_full",
    "file_syscall_enter:map_full",
    "openat_exit:ringbuf_full",
    "sched_process_fork:map_full",
    "nfs_done:ringbuf_full",
    "nfs_initiate:map_full",
    "rpc_join:map_full",
    "proc:ringbuf_full",
    "ipc_syscall_exit:ringbuf_full",
    "block_rq_complete:unseen",
    "io_uring_submit_req:map_full",
];

#[derive(Serialize, Clone, Debug)]
pub struct ProgStats {
    pub run_cnt: u64,
    pub run_time_ns: u64,
    pub ns_per_run: f64,
}

pub struct Probes<'o> {
    block: Option<BlockSkel<'o>>,
    file: Option<FileSkel<'o>>,
    nfs: Option<NfsSkel<'o>>,
    links: std::cell::RefCell<Vec<Link>>,
    /// Kernel BPF statistics are on while this fd is open (sampled: see set_stats).
    stats_fd: std::cell::RefCell<Option<OwnedFd>>,
    stats_wanted: bool,
    /// Set by detach(): from then on lost() counts the requests left in flight.
    detached: std::cell::Cell<bool>,
    in_flight_at_end: std::cell::OnceCell<u64>,
    pub skipped: BTreeMap<String, String>,
    /// Settings::tls_libs, attached to with the linker cache's libssl.
    tls_libs: Vec<std::path::PathBuf>,
}

/// All tracepoint names under tracefs, as `group/name`.
fn tracepoints(tracefs: &Path) -> HashSet<String> {
    let mut all = HashSet::new();
    if let Ok(groups) = std::fs::read_dir(tracefs.join("events")) {
        for g in groups.flatten().filter(|g| g.path().is_dir()) {
            if let Ok(evs) = std::fs::read_dir(g.path()) {
                for e in evs.flatten() {
                    all.insert(format!("{}/{}", g.file_name().to_string_lossy(), e.file_name().to_string_lossy()));
                }
            }
        }
    }
    all
}

/// The online CPUs, from /sys/devices/system/cpu/online ("0-3,6"); CPU 0 if unreadable.
fn online_cpus() -> Vec<u32> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let cpus = parse_cpu_list(&text);
    if cpus.is_empty() {
        vec![0]
    } else {
        cpus
    }
}

fn parse_cpu_list(text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(lo), Ok(hi)) = (lo.trim().parse::<u32>(), hi.trim().parse::<u32>()) {
            out.extend(lo..=hi);
        }
    }
    out
}

/// Whether a program's attach point exists: SEC("tracepoint/G/N") needs G/N, and
/// SEC("tp_btf/N") needs a tracepoint N in any group.
fn attach_point_exists(section: &str, tps: &HashSet<String>) -> bool {
    if let Some(gn) = section.strip_prefix("tracepoint/") {
        tps.contains(gn)
    } else if let Some(n) = section.strip_prefix("tp_btf/") {
        tps.iter().any(|t| t.rsplit_once('/').is_some_and(|(_, name)| name == n))
    } else {
        true
    }
}

/// Field name → (offset, size) of a tracepoint's record, from its tracefs `format` file
/// (`field:TYPE NAME;\toffset:N;\tsize:N;\tsigned:N;`). Empty when the event is absent.
pub fn tracepoint_fields(tracefs: &Path, group_name: &str) -> BTreeMap<String, (u32, u32)> {
    let text = std::fs::read_to_string(tracefs.join("events").join(group_name).join("format")).unwrap_or_default();
    parse_format(&text)
}

fn parse_format(text: &str) -> BTreeMap<String, (u32, u32)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("field:") else { continue };
        let mut parts = rest.split(';').map(str::trim);
        let decl = parts.next().unwrap_or("");
        let (mut off, mut size) = (None, None);
        for p in parts {
            if let Some(v) = p.strip_prefix("offset:") {
                off = v.parse().ok();
            } else if let Some(v) = p.strip_prefix("size:") {
                size = v.parse().ok();
            }
        }
        // The name is the declaration's last word, less any array suffix.
        let name = decl.rsplit(' ').next().unwrap_or("").split('[').next().unwrap_or("");
        if let (false, Some(o), Some(s)) = (name.is_empty(), off, size) {
            out.insert(name.to_string(), (o, s));
        }
    }
    out
}

/// Offsets of the sunrpc fields the nfs probes join onto NFS rows (see nfs.bpf.c).
#[derive(Debug, PartialEq)]
struct RpcLayout {
    lat_client: u32,
    lat_xid: u32,
    lat_backlog: u32,
    lat_rtt: u32,
    lat_execute: u32,
    lat_time_size: u32,
    /// (client_id, xid, status) of xprt_transmit, when it has them.
    xmit: Option<(u32, u32, u32)>,
}

/// Reads the layouts of rpc_stats_latency and xprt_transmit; Err says what is missing.
fn rpc_layout(
    latency: &BTreeMap<String, (u32, u32)>,
    transmit: &BTreeMap<String, (u32, u32)>,
) -> Result<RpcLayout, String> {
    if latency.is_empty() {
        return Err("sunrpc:rpc_stats_latency is not in this kernel".into());
    }
    let want = |fields: &BTreeMap<String, (u32, u32)>, event: &str, name: &str, sizes: &[u32]| match fields.get(name) {
        Some(&(off, size)) if sizes.contains(&size) => Ok((off, size)),
        Some(&(_, size)) => Err(format!("sunrpc:{event} field {name} has size {size}")),
        None => Err(format!("sunrpc:{event} has no field {name}")),
    };
    let (lat_client, _) = want(latency, "rpc_stats_latency", "client_id", &[4])?;
    let (lat_xid, _) = want(latency, "rpc_stats_latency", "xid", &[4])?;
    let (lat_backlog, lat_time_size) = want(latency, "rpc_stats_latency", "backlog", &[4, 8])?;
    let (lat_rtt, s2) = want(latency, "rpc_stats_latency", "rtt", &[4, 8])?;
    let (lat_execute, s3) = want(latency, "rpc_stats_latency", "execute", &[4, 8])?;
    if s2 != lat_time_size || s3 != lat_time_size {
        return Err("sunrpc:rpc_stats_latency: backlog, rtt and execute differ in size".into());
    }
    let xmit = (|| {
        let (c, _) = want(transmit, "xprt_transmit", "client_id", &[4]).ok()?;
        let (x, _) = want(transmit, "xprt_transmit", "xid", &[4]).ok()?;
        let (s, _) = want(transmit, "xprt_transmit", "status", &[4]).ok()?;
        Some((c, x, s))
    })();
    Ok(RpcLayout { lat_client, lat_xid, lat_backlog, lat_rtt, lat_execute, lat_time_size, xmit })
}

/// Switches off the programs whose attach point is missing, noting them as skipped.
fn autoload_available<'a>(
    progs: impl Iterator<Item = libbpf_rs::OpenProgramMut<'a>>,
    tps: &HashSet<String>,
    skipped: &mut BTreeMap<String, String>,
) {
    for mut p in progs {
        let section = p.section().to_string_lossy().into_owned();
        if !attach_point_exists(&section, tps) {
            p.set_autoload(false);
            skipped.insert(section, "tracepoint not present in this kernel".into());
        }
    }
}

/// The block layer's probes, configured (the device filter filled after load), or None
/// when the kernel lacks the block tracepoints (noted in `skipped`).
fn load_block<'o>(
    s: &Settings,
    obj: &'o mut MaybeUninit<OpenObject>,
    tps: &HashSet<String>,
    wakeup: u64,
    skipped: &mut BTreeMap<String, String>,
) -> Result<Option<BlockSkel<'o>>> {
    let mut open = BlockSkelBuilder::default().open(obj).context("opening the block probes")?;
    let needed = ["tp_btf/block_rq_issue", "tp_btf/block_rq_complete"];
    if let Some(missing) = needed.iter().find(|n| !attach_point_exists(n, tps)) {
        skipped.insert("block".into(), format!("{missing} is not in this kernel: block layer not recorded"));
        Ok(None)
    } else {
        let ro = open.maps.rodata_data.as_deref_mut().context("block probes: no rodata")?;
        ro.wakeup_bytes = wakeup;
        ro.filter_devs = !s.devs.is_empty();
        // The CPUs whose counters make up a disk's own in-flight count (block.bpf.c,
        // disk_in_flight); 0, where unknown, leaves the queue depth to devtab's count.
        ro.nr_cpus = libbpf_rs::num_possible_cpus().ok().and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
        // Tests shrink the request and device tables to one slot each, so that the
        // hash-map fallbacks behind them are exercised (tests/recorder).
        if std::env::var_os("TRAINIO_TEST_ONE_SLOT_TABLES").is_some() {
            ro.dev_bits = 0;
            ro.slot_bits = 0;
        }
        // Tests hold completions in their per-CPU batches until the flush at the
        // end, whose rows must then all arrive (tests/recorder).
        if let Some(ms) = std::env::var("TRAINIO_TEST_BATCH_AGE_MS").ok().and_then(|v| v.parse::<u64>().ok()) {
            ro.batch_age_ns = ms * 1_000_000;
        }
        let (dev_bits, slot_bits) = (ro.dev_bits, ro.slot_bits);
        open.maps.devtab.set_max_entries(1 << dev_bits).context("sizing the device table")?;
        open.maps.slots.set_max_entries(1 << slot_bits).context("sizing the request table")?;
        open.maps.block_events.set_max_entries(s.ringbuf_bytes).context("sizing the block ring buffer")?;
        autoload_available(open.open_object_mut().progs_mut(), tps, skipped);
        let skel = open.load().context("loading the block probes into the kernel")?;
        // The device filter: each device in its devtab slot, or in the devs map when
        // another selected device has that slot (block.bpf.c, dev_state()).
        let mut taken = HashSet::new();
        for &d in &s.devs {
            let mut state = [0u8; std::mem::size_of::<crate::bpf::dev_state>()];
            state[..4].copy_from_slice(&d.to_ne_bytes());
            let h = d.wrapping_mul(0x9E37_79B1);
            let slot = if dev_bits == 0 { 0 } else { h >> (32 - dev_bits) };
            if taken.insert(slot) {
                skel.maps.devtab.update(&slot.to_ne_bytes(), &state, MapFlags::ANY)
            } else {
                skel.maps.devs.update(&d.to_ne_bytes(), &state, MapFlags::ANY)
            }
            .context("filling the device filter")?;
        }
        Ok(Some(skel))
    }
}

/// The file layer's probes, following `s.target`; io_uring's only with `s.io_uring`.
fn load_file<'o>(
    s: &Settings,
    obj: &'o mut MaybeUninit<OpenObject>,
    tps: &HashSet<String>,
    wakeup: u64,
    skipped: &mut BTreeMap<String, String>,
) -> Result<FileSkel<'o>> {
    let mut open = FileSkelBuilder::default().open(obj).context("opening the file probes")?;
    let ro = open.maps.rodata_data.as_deref_mut().context("file probes: no rodata")?;
    ro.wakeup_bytes = wakeup;
    ro.self_tgid = std::process::id();
    ro.object_layer = s.object.into();
    match s.target {
        Target::All => ro.target_mode = 0,
        Target::Tgids => ro.target_mode = 1,
        Target::Cgroup(id, level) => {
            ro.target_mode = 2;
            ro.target_cgroup_id = id;
            ro.target_cgroup_level = level;
        }
    }
    open.maps.file_events.set_max_entries(s.ringbuf_bytes).context("sizing the file ring buffer")?;
    autoload_available(open.open_object_mut().progs_mut(), tps, skipped);
    for mut p in open.open_object_mut().progs_mut() {
        let section = p.section().to_string_lossy().into_owned();
        if (!s.io_uring && section.starts_with("tp_btf/io_uring_")) || (!s.object && is_uprobe(&section)) {
            p.set_autoload(false);
        }
    }
    open.load().context("loading the file probes into the kernel")
}

/// The NFS client's probes, with the sunrpc tracepoints' field offsets read from
/// tracefs (their rpc_* columns switched off where the layout is not the one expected),
/// or None when the kernel has no nfs tracepoints.
fn load_nfs<'o>(
    s: &Settings,
    obj: &'o mut MaybeUninit<OpenObject>,
    tracefs: &Path,
    tps: &HashSet<String>,
    wakeup: u64,
    skipped: &mut BTreeMap<String, String>,
) -> Result<Option<NfsSkel<'o>>> {
    if !attach_point_exists("tracepoint/nfs/nfs_initiate_read", tps) {
        skipped.insert(
            "nfs".into(),
            "this kernel has no nfs tracepoints (no NFS client loaded): nfs layer not recorded".into(),
        );
        Ok(None)
    } else {
        let mut open = NfsSkelBuilder::default().open(obj).context("opening the nfs probes")?;
        let ro = open.maps.rodata_data.as_deref_mut().context("nfs probes: no rodata")?;
        ro.wakeup_bytes = wakeup;
        let layout = if attach_point_exists("tracepoint/sunrpc/rpc_task_end", tps) {
            rpc_layout(
                &tracepoint_fields(tracefs, "sunrpc/rpc_stats_latency"),
                &tracepoint_fields(tracefs, "sunrpc/xprt_transmit"),
            )
        } else {
            Err("sunrpc:rpc_task_end is not in this kernel".into())
        };
        let mut rpc_off: Vec<&str> = Vec::new();
        match &layout {
            Ok(l) => {
                ro.lat_client_off = l.lat_client;
                ro.lat_xid_off = l.lat_xid;
                ro.lat_backlog_off = l.lat_backlog;
                ro.lat_rtt_off = l.lat_rtt;
                ro.lat_execute_off = l.lat_execute;
                ro.lat_time_size = l.lat_time_size;
                if let Some((c, x, st)) = l.xmit {
                    ro.xmit_client_off = c;
                    ro.xmit_xid_off = x;
                    ro.xmit_status_off = st;
                    ro.count_xmits = true;
                } else {
                    rpc_off.push("tracepoint/sunrpc/xprt_transmit");
                    skipped.insert(
                        "tracepoint/sunrpc/xprt_transmit".into(),
                        "no client_id/xid/status fields of 4 bytes: rpc_retrans not recorded".into(),
                    );
                }
            }
            Err(why) => {
                rpc_off.extend([
                    "tracepoint/sunrpc/rpc_task_end",
                    "tracepoint/sunrpc/rpc_stats_latency",
                    "tracepoint/sunrpc/xprt_transmit",
                ]);
                skipped.insert("nfs_rpc".into(), format!("{why}: rpc_* columns not recorded"));
            }
        }
        open.maps.nfs_events.set_max_entries(s.ringbuf_bytes).context("sizing the nfs ring buffer")?;
        for mut p in open.open_object_mut().progs_mut() {
            if rpc_off.iter().any(|sec| p.section().to_string_lossy() == *sec) {
                p.set_autoload(false);
            }
        }
        autoload_available(open.open_object_mut().progs_mut(), tps, skipped);
        Ok(Some(open.load().context("loading the nfs probes into the kernel")?))
    }
}

impl<'o> Probes<'o> {
    pub fn load(
        s: &Settings,
        block_obj: &'o mut MaybeUninit<OpenObject>,
        file_obj: &'o mut MaybeUninit<OpenObject>,
        nfs_obj: &'o mut MaybeUninit<OpenObject>,
    ) -> Result<Probes<'o>> {
        let tracefs = host::tracefs()?;
        let tps = tracepoints(&tracefs);
        let mut skipped = BTreeMap::new();
        let wakeup = (s.ringbuf_bytes as u64 / 4).min(1 << 20);

        let block = if s.block { load_block(s, block_obj, &tps, wakeup, &mut skipped)? } else { None };
        let file = if s.file { Some(load_file(s, file_obj, &tps, wakeup, &mut skipped)?) } else { None };
        let nfs = if s.nfs { load_nfs(s, nfs_obj, &tracefs, &tps, wakeup, &mut skipped)? } else { None };

        let mut probes = Probes {
            block,
            file,
            nfs,
            links: Default::default(),
            stats_fd: Default::default(),
            stats_wanted: s.bpf_stats,
            detached: Default::default(),
            in_flight_at_end: Default::default(),
            skipped,
            tls_libs: s.tls_libs.clone(),
        };
        probes.set_stats(true);
        probes.attach()?;
        Ok(probes)
    }

    /// The loaded programs of every object (those switched off before load excluded).
    fn programs(&self) -> Vec<libbpf_rs::ProgramMut<'_>> {
        let mut progs = Vec::new();
        if let Some(b) = &self.block {
            progs.extend(b.object().progs_mut());
        }
        if let Some(f) = &self.file {
            progs.extend(f.object().progs_mut());
        }
        if let Some(n) = &self.nfs {
            progs.extend(n.object().progs_mut());
        }
        progs.retain(|p| p.autoload());
        progs
    }

    fn attach(&mut self) -> Result<()> {
        let mut links = Vec::new();
        // SEC("raw_tp") with no tracepoint: run by user space (flush_block), never attached;
        // the uprobes have no target of their own: attached to each libssl (attach_tls).
        for p in self.programs().into_iter().filter(|p| {
            let section = p.section().to_string_lossy();
            section != "raw_tp" && !is_uprobe(&section)
        }) {
            let link = p.attach().with_context(|| {
                format!("attaching {} ({})", p.name().to_string_lossy(), p.section().to_string_lossy())
            })?;
            links.push(link);
        }
        if let Some(f) = self.file.as_ref().filter(|f| f.progs.tio_ssl_return.autoload()) {
            let mut libs = tls_libraries();
            for lib in &self.tls_libs {
                if !libs.contains(lib) {
                    libs.push(lib.clone());
                }
            }
            attach_tls(f, &libs, &mut links, &mut self.skipped);
        }
        *self.links.get_mut() = links;
        if self.links.get_mut().is_empty() {
            bail!("no probe could be attached: {:?}", self.skipped);
        }
        Ok(())
    }

    /// The file layer's traced-process map, for seeding it (also from a forked child).
    pub fn traced_map_fd(&self) -> Option<RawFd> {
        self.file.as_ref().map(|f| f.maps.traced.as_fd().as_raw_fd())
    }

    /// Traces `pid` and its descendants: those it has now (a data loader's workers forked
    /// before we attached) from /proc, and those started from now on through the fork probe.
    /// The root goes in first and /proc is read twice, so that a child forked while the
    /// first list was being read is followed by the probe or found by the second read.
    pub fn trace_pid(&self, pid: u32) -> Result<()> {
        if let Some(f) = &self.file {
            let add = |p: u32| f.maps.traced.update(&p.to_ne_bytes(), &0u32.to_ne_bytes(), MapFlags::ANY);
            add(pid).context("adding the target pid")?;
            for _ in 0..2 {
                for child in host::descendants(pid) {
                    add(child).context("adding the target's descendants")?;
                }
            }
        }
        Ok(())
    }

    pub fn ring_buffer<'cb>(&'cb self, mut on_record: impl FnMut(&[u8]) -> i32 + 'cb) -> Result<RingBuffer<'cb>>
    where
        'o: 'cb,
    {
        // One callback shared by every ring buffer: records carry their own kind tag.
        let cb = std::rc::Rc::new(std::cell::RefCell::new(move |d: &[u8]| on_record(d)));
        let mut builder = RingBufferBuilder::new();
        if let Some(b) = &self.block {
            let cb = cb.clone();
            builder.add(&b.maps.block_events, move |d| (cb.borrow_mut())(d))?;
        }
        if let Some(f) = &self.file {
            let cb = cb.clone();
            builder.add(&f.maps.file_events, move |d| (cb.borrow_mut())(d))?;
        }
        if let Some(n) = &self.nfs {
            let cb = cb.clone();
            builder.add(&n.maps.nfs_events, move |d| (cb.borrow_mut())(d))?;
        }
        builder.build().context("setting up the ring buffer reader")
    }

    /// Events lost per probe so far (summed over CPUs and objects).
    pub fn lost(&self) -> BTreeMap<String, u64> {
        let mut out: BTreeMap<String, u64> = BTreeMap::new();
        let mut add = |map: &dyn MapCore, indices: std::ops::Range<u32>| {
            for i in indices {
                let n: u64 = map
                    .lookup_percpu(&i.to_ne_bytes(), MapFlags::ANY)
                    .ok()
                    .flatten()
                    .map(|per_cpu| per_cpu.iter().map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap())).sum())
                    .unwrap_or(0);
                *out.entry(LOST_NAMES[i as usize].to_string()).or_default() += n;
            }
        };
        if let Some(b) = &self.block {
            add(&b.maps.lost, 0..2);
            add(&b.maps.lost, 11..12);
        }
        if let Some(f) = &self.file {
            add(&f.maps.lost, 2..6);
            add(&f.maps.lost, 9..11);
        }
        if let Some(n) = &self.nfs {
            add(&n.maps.lost, 6..9);
        }
        for (prog, n) in self.recursion_lost() {
            out.insert(format!("{prog}:recursion"), n);
        }
        // Once detached, requests still marked issued have no completion in the trace.
        if self.detached.get() {
            // One scan of the request tables (tens of thousands of lookups), however
            // often lost() is asked after detaching.
            let n = *self.in_flight_at_end.get_or_init(|| self.block_in_flight());
            if n > 0 {
                out.insert("block_rq_complete:in_flight_at_end".into(), n);
            }
        }
        out
    }

    /// Events each program missed because it was already running on the CPU: the kernel
    /// skips a tracing program that an interrupt re-enters and counts a recursion miss.
    fn recursion_lost(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for p in self.programs() {
            let mut info: libbpf_sys::bpf_prog_info = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
            // SAFETY: info is a zeroed bpf_prog_info of the size we pass.
            let rc = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(p.as_fd().as_raw_fd(), &mut info, &mut len) };
            if rc == 0 && info.recursion_misses > 0 {
                out.insert(p.name().to_string_lossy().into_owned(), info.recursion_misses);
            }
        }
        out
    }

    /// Block requests issued while recording whose completion the trace lacks: in flight
    /// when the probes were detached, or completed where the kernel did not run the
    /// completion probe and not issued again since (block_rq_complete:unseen counts those
    /// issued again). Read after detaching.
    fn block_in_flight(&self) -> u64 {
        let Some(b) = &self.block else { return 0 };
        // A live entry (rq set: a freed slot keeps its other fields) marked issued.
        let word = |v: &[u8], at: usize| v.get(at..at + 8).map_or(0, |b| u64::from_ne_bytes(b.try_into().unwrap()));
        let (rq_at, issue_at) =
            (std::mem::offset_of!(crate::bpf::req_state, rq), std::mem::offset_of!(crate::bpf::req_state, issue_ns));
        let issued = |v: &[u8]| word(v, rq_at) != 0 && word(v, issue_at) != 0;
        let slots = &b.maps.slots;
        let n_slots = slots.max_entries();
        let in_slots = (0..n_slots)
            .filter(|i| slots.lookup(&i.to_ne_bytes(), MapFlags::ANY).ok().flatten().is_some_and(|v| issued(&v)))
            .count();
        let overflow = &b.maps.overflow;
        let in_overflow = overflow
            .keys()
            .filter(|k| overflow.lookup(k, MapFlags::ANY).ok().flatten().is_some_and(|v| issued(&v)))
            .count();
        (in_slots + in_overflow) as u64
    }

    /// Turns the kernel's BPF run-time statistics on or off. They cost two clock reads
    /// per program run (about 20% of a 250k-IOPS device's throughput here, while on), so
    /// the recorder samples them (record.rs, StatsSampler); run counts and times
    /// accumulate only while on.
    pub fn set_stats(&self, on: bool) {
        let mut fd = self.stats_fd.borrow_mut();
        if on && self.stats_wanted && fd.is_none() {
            // SAFETY: plain syscall wrapper; a non-negative return is an fd we now own.
            let raw = unsafe { libbpf_sys::bpf_enable_stats(libbpf_sys::BPF_STATS_RUN_TIME) };
            *fd = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) });
        } else if !on {
            *fd = None;
        }
    }

    /// Whether the kernel's BPF statistics are on (set_stats).
    pub fn stats_on(&self) -> bool {
        self.stats_fd.borrow().is_some()
    }

    /// Program runs timed so far, all programs together.
    pub fn timed_runs(&self) -> u64 {
        self.bpf_stats().values().map(|s| s.run_cnt).sum()
    }

    /// Run count and time per attached program, from the kernel's BPF statistics (counted
    /// only while sampling was on).
    pub fn bpf_stats(&self) -> BTreeMap<String, ProgStats> {
        let mut out = BTreeMap::new();
        if !self.stats_wanted {
            return out;
        }
        for p in self.programs() {
            let mut info: libbpf_sys::bpf_prog_info = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libbpf_sys::bpf_prog_info>() as u32;
            // SAFETY: info is a zeroed bpf_prog_info of the size we pass.
            let rc = unsafe { libbpf_sys::bpf_prog_get_info_by_fd(p.as_fd().as_raw_fd(), &mut info, &mut len) };
            if rc == 0 {
                let ns_per_run = if info.run_cnt > 0 { info.run_time_ns as f64 / info.run_cnt as f64 } else { 0.0 };
                out.insert(
                    p.name().to_string_lossy().into_owned(),
                    ProgStats { run_cnt: info.run_cnt, run_time_ns: info.run_time_ns, ns_per_run },
                );
            }
        }
        out
    }

    /// Writes the block completions each CPU holds in its batch (block.bpf.c, pending):
    /// those older than the batch age, or all of them with `force` (after detaching).
    /// Runs tio_block_flush on every online CPU; a CPU it cannot run on is skipped.
    pub fn flush_block(&self, force: bool) {
        let Some(b) = &self.block else { return };
        let prog = &b.progs.tio_block_flush;
        for cpu in online_cpus() {
            let mut args = u64::from(force).to_ne_bytes();
            let input = libbpf_rs::ProgramInput {
                context_in: Some(&mut args),
                cpu,
                flags: libbpf_sys::BPF_F_TEST_RUN_ON_CPU,
                ..Default::default()
            };
            let _ = prog.test_run(input);
        }
    }

    /// Block completions still in a CPU's batch, as block_batch records (kind, count,
    /// events), read from the `pending` map: after the final flush_block(true) only a CPU
    /// that could not run the flush (offline) has any. Call after detaching.
    pub fn take_pending_block(&self) -> Vec<Vec<u8>> {
        let Some(b) = &self.block else { return Vec::new() };
        let per_cpu =
            b.maps.pending.lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY).ok().flatten().unwrap_or_default();
        let at = std::mem::offset_of!(crate::bpf::block_pending, batch);
        per_cpu
            .iter()
            .filter_map(|v| {
                // The whole batch: the decoder reads `count` events and checks they fit.
                let mut rec = v.get(at..)?.to_vec();
                let count = u32::from_ne_bytes(rec.get(4..8)?.try_into().ok()?);
                // The kernel sets the kind when it writes a batch, not while filling it.
                rec[..4].copy_from_slice(&crate::bpf::trainio_kind::TRAINIO_KIND_BLOCK_BATCH.0.to_ne_bytes());
                (count > 0).then_some(rec)
            })
            .collect()
    }

    /// Detaches every program now; maps stay readable until the skeletons are dropped.
    /// One link at a time: each classic tracepoint's close waits out an RCU grace period
    /// (~70 ms here, ~1.4 s for the file layer), but closing them from several threads at
    /// once can soft-lock the CPUs of the NFS guest's 6.1 kernel.
    pub fn detach(&self) {
        self.detached.set(true);
        self.links.borrow_mut().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sunrpc:rpc_stats_latency as Debian 12's 6.1 kernel has it (docs/design/nfs-guest.md).
    const LATENCY_6_1: &str = "name: rpc_stats_latency
ID: 1471
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:unsigned int task_id;\toffset:8;\tsize:4;\tsigned:0;
\tfield:unsigned int client_id;\toffset:12;\tsize:4;\tsigned:0;
\tfield:u32 xid;\toffset:16;\tsize:4;\tsigned:0;
\tfield:int version;\toffset:20;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] progname;\toffset:24;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] procname;\toffset:28;\tsize:4;\tsigned:1;
\tfield:unsigned long backlog;\toffset:32;\tsize:8;\tsigned:0;
\tfield:unsigned long rtt;\toffset:40;\tsize:8;\tsigned:0;
\tfield:unsigned long execute;\toffset:48;\tsize:8;\tsigned:0;

print fmt: \"task:%08x@%08x xid=0x%08x\", REC->task_id, REC->client_id, REC->xid
";

    const TRANSMIT_6_1: &str = "format:
\tfield:unsigned int task_id;\toffset:8;\tsize:4;\tsigned:0;
\tfield:unsigned int client_id;\toffset:12;\tsize:4;\tsigned:0;
\tfield:u32 xid;\toffset:16;\tsize:4;\tsigned:0;
\tfield:u32 seqno;\toffset:20;\tsize:4;\tsigned:0;
\tfield:int status;\toffset:24;\tsize:4;\tsigned:1;
";

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-1\n"), vec![0, 1]);
        assert_eq!(parse_cpu_list("0,2-4,7"), vec![0, 2, 3, 4, 7]);
        assert_eq!(parse_cpu_list(""), Vec::<u32>::new());
    }

    #[test]
    fn format_files_give_offsets_and_sizes() {
        let f = parse_format(LATENCY_6_1);
        assert_eq!(f["common_pid"], (4, 4));
        assert_eq!(f["procname"], (28, 4), "__data_loc char[] NAME is named NAME");
        assert_eq!(f["execute"], (48, 8));
        let v: BTreeMap<_, _> = parse_format("\tfield:char verifier[8];\toffset:56;\tsize:8;\tsigned:1;");
        assert_eq!(v["verifier"], (56, 8));
    }

    #[test]
    fn rpc_layout_of_6_1_and_of_a_kernel_that_moved_fields() {
        let l = rpc_layout(&parse_format(LATENCY_6_1), &parse_format(TRANSMIT_6_1)).unwrap();
        assert_eq!(
            l,
            RpcLayout {
                lat_client: 12,
                lat_xid: 16,
                lat_backlog: 32,
                lat_rtt: 40,
                lat_execute: 48,
                lat_time_size: 8,
                xmit: Some((12, 16, 24))
            }
        );
        // Newer kernels append xprt_id and may reorder: offsets follow the format file.
        let moved = LATENCY_6_1.replace("offset:32;", "offset:64;").replace("offset:48;", "offset:72;");
        let l = rpc_layout(&parse_format(&moved), &BTreeMap::new()).unwrap();
        assert_eq!((l.lat_backlog, l.lat_execute, l.xmit), (64, 72, None));
    }

    #[test]
    fn rpc_layout_says_what_is_missing() {
        assert!(rpc_layout(&BTreeMap::new(), &BTreeMap::new()).unwrap_err().contains("not in this kernel"));
        let no_rtt = LATENCY_6_1.replace("long rtt;", "long round_trip;");
        assert_eq!(
            rpc_layout(&parse_format(&no_rtt), &BTreeMap::new()).unwrap_err(),
            "sunrpc:rpc_stats_latency has no field rtt"
        );
        let small_xid = LATENCY_6_1.replace("xid;\toffset:16;\tsize:4", "xid;\toffset:16;\tsize:2");
        assert!(rpc_layout(&parse_format(&small_xid), &BTreeMap::new()).unwrap_err().contains("xid has size 2"));
    }
}
