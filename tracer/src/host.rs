//! Facts about this machine: clocks, devices, mounts, tracefs. Everything here reads
//! /proc and /sys; nothing is written except the tracefs mount the syscall probes need.
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

fn clock_ns(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec to write into.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// CLOCK_MONOTONIC now, in ns: the clock bpf_ktime_get_ns() reads.
pub fn monotonic_ns() -> i64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME − CLOCK_MONOTONIC, taken as the middle of three readings.
pub fn clock_offset_ns() -> i64 {
    let a = monotonic_ns();
    let wall = clock_ns(libc::CLOCK_REALTIME);
    let b = monotonic_ns();
    wall - (a + (b - a) / 2)
}

pub fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

pub fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// The kernel-internal dev_t (major << 20 | minor) the BPF programs report.
pub fn kernel_dev(major: u32, minor: u32) -> u32 {
    (major << 20) | minor
}

fn parse_majmin(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Resolves `--dev` (a name like `loop0`/`/dev/nvme0n1` or `MAJ:MIN`) to the whole disk
/// whose requests the block probes see. A partition resolves to its disk.
pub fn resolve_block_device(spec: &str) -> Result<(u32, String)> {
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::MetadataExt;
    let node = fs::metadata(spec).ok().filter(|m| m.file_type().is_block_device());
    let sys = if let Some((ma, mi)) = parse_majmin(spec) {
        PathBuf::from(format!("/sys/dev/block/{ma}:{mi}"))
    } else if let Some(m) = node {
        // a device node (or a link to one) at any path: the device it stands for
        let rdev = m.rdev();
        PathBuf::from(format!("/sys/dev/block/{}:{}", libc::major(rdev), libc::minor(rdev)))
    } else {
        let name = spec.trim_start_matches("/dev/");
        PathBuf::from(format!("/sys/class/block/{name}"))
    };
    let sys = fs::canonicalize(&sys).map_err(|_| anyhow::anyhow!("--dev {spec}: no such block device"))?;
    let disk = if sys.join("partition").exists() { sys.parent().unwrap().to_path_buf() } else { sys };
    let devstr =
        fs::read_to_string(disk.join("dev")).with_context(|| format!("--dev {spec}: reading {}", disk.display()))?;
    let Some((ma, mi)) = parse_majmin(&devstr) else { bail!("--dev {spec}: unreadable {}/dev", disk.display()) };
    let name = disk.file_name().unwrap().to_string_lossy().into_owned();
    Ok((kernel_dev(ma, mi), name))
}

#[derive(Serialize, Clone, Debug)]
pub struct Mount {
    pub mount_point: String,
    pub fstype: String,
    pub source: String,
    pub options: String,
}

#[derive(Serialize, Clone, Debug)]
pub struct DeviceInfo {
    pub dev: String,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backing_file: Option<String>,
    pub mounts: Vec<Mount>,
}

/// (MAJ:MIN of the mounted device, mount) for every line of /proc/self/mountinfo.
fn mounts() -> Vec<(String, Mount)> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            let (majmin, point, opts) = (l.get(2)?, l.get(4)?, l.get(5)?);
            Some((
                majmin.to_string(),
                Mount {
                    mount_point: point.to_string(),
                    fstype: r.first()?.to_string(),
                    source: r.get(1).unwrap_or(&"").to_string(),
                    options: format!("{opts},{}", r.get(2).unwrap_or(&"")),
                },
            ))
        })
        .collect()
}

/// The disk a `MAJ:MIN` belongs to (itself unless it is a partition). Major 0 is the
/// kernel's unnamed devices (tmpfs, proc, overlay, NFS…): never a partition, answered
/// without a sysfs path walk (this runs for every mount in mountinfo).
fn disk_of(majmin: &str) -> String {
    if majmin.starts_with("0:") {
        return majmin.to_string();
    }
    let sys = Path::new("/sys/dev/block").join(majmin);
    match fs::canonicalize(&sys) {
        Ok(p) if p.join("partition").exists() => fs::read_to_string(p.parent().unwrap().join("dev"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| majmin.to_string()),
        _ => majmin.to_string(),
    }
}

/// Describes each device (MAJ:MIN strings) for the trace metadata.
pub fn describe_devices<'a>(devs: impl IntoIterator<Item = &'a str>) -> Vec<DeviceInfo> {
    let all_mounts = mounts();
    let mut out = BTreeMap::new();
    for dev in devs {
        let sys = Path::new("/sys/dev/block").join(dev);
        let real = fs::canonicalize(&sys).ok();
        let name = real
            .as_ref()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .or_else(|| all_mounts.iter().find(|(m, _)| m == dev).map(|(_, m)| m.source.clone()))
            .unwrap_or_default();
        let size_bytes =
            fs::read_to_string(sys.join("size")).ok().and_then(|s| s.trim().parse::<u64>().ok()).map(|s| s * 512);
        let backing_file = fs::read_to_string(sys.join("loop/backing_file")).ok().map(|s| s.trim().to_string());
        let mounts = all_mounts.iter().filter(|(m, _)| m == dev || disk_of(m) == dev).map(|(_, m)| m.clone()).collect();
        out.insert(dev.to_string(), DeviceInfo { dev: dev.to_string(), name, size_bytes, backing_file, mounts });
    }
    out.into_values().collect()
}

/// The processes descended from `root` now (children, their children, …), parents before
/// their children, from each process's parent in /proc/PID/stat. `root` itself is not in it.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut children: std::collections::HashMap<u32, Vec<u32>> = std::collections::HashMap::new();
    for pid in all_pids() {
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        if let Some((ppid, _)) = parse_stat(&stat) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = Vec::new();
    let mut next = vec![root];
    while let Some(p) = next.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            if c != root && !out.contains(&c) {
                out.push(c);
                next.push(c);
            }
        }
    }
    out
}

/// A process as /proc describes it, for its proc `start` row.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcInfo {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// /proc/PID/cmdline, NULs as spaces, at most 255 bytes; empty for a kernel thread
    /// or a zombie.
    pub cmdline: String,
}

/// `pid`'s parent, comm and command line now; None once it is gone.
pub fn proc_info(pid: u32) -> Option<ProcInfo> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (ppid, comm) = parse_stat(&stat)?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    Some(ProcInfo { pid, ppid, comm, cmdline: cmdline_string(&cmdline) })
}

/// (ppid, comm) of a /proc/PID/stat line: "PID (COMM) STATE PPID …", where COMM may hold
/// spaces and parentheses.
fn parse_stat(stat: &str) -> Option<(u32, String)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let ppid = stat.get(close + 1..)?.split_whitespace().nth(1)?.parse().ok()?;
    Some((ppid, stat.get(open + 1..close)?.to_string()))
}

/// A command line as /proc/PID/cmdline holds it (arguments each ended by NUL) with the
/// NULs as spaces, cut to at most 255 bytes on a character boundary.
pub fn cmdline_string(raw: &[u8]) -> String {
    let trimmed = raw.strip_suffix(&[0]).unwrap_or(raw);
    let mut s = String::from_utf8_lossy(trimmed).replace('\0', " ");
    if s.len() > 255 {
        let mut end = 255;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Every process now (not threads), from /proc.
pub fn all_pids() -> Vec<u32> {
    let mut pids: Vec<u32> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect();
    pids.sort_unstable();
    pids
}

/// The processes in a cgroup-v2 directory now (its own members, as the file layer's
/// cgroup test selects them, not those of its children).
pub fn cgroup_pids(path: &Path) -> Vec<u32> {
    // The cgroup's processes and its descendants' (the file layer traces the subtree).
    let mut pids = Vec::new();
    let mut dirs = vec![path.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        pids.extend(
            fs::read_to_string(dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse::<u32>().ok()),
        );
        if let Ok(entries) = fs::read_dir(&dir) {
            dirs.extend(entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Where the syscall tracepoints are described; mounts tracefs if nothing has (libbpf
/// looks tracepoint ids up there).
pub fn tracefs() -> Result<PathBuf> {
    for p in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(p).join("events").is_dir() {
            return Ok(PathBuf::from(p));
        }
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: valid NUL-terminated strings; mounting tracefs has no other effect.
    let rc = unsafe { libc::mount(c"tracefs".as_ptr(), target.as_ptr(), c"tracefs".as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        bail!(
            "tracefs is not mounted and mounting it on /sys/kernel/tracing failed: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(PathBuf::from("/sys/kernel/tracing"))
}

/// The cgroup-v2 id (the directory's inode number) that bpf_get_current_cgroup_id() returns.
pub fn cgroup_id(path: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut fs_stat: libc::statfs = unsafe { std::mem::zeroed() };
    let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: valid path and out-pointer.
    if unsafe { libc::statfs(cpath.as_ptr(), &mut fs_stat) } != 0 {
        bail!("--cgroup {}: {}", path.display(), std::io::Error::last_os_error());
    }
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    if fs_stat.f_type as i64 != CGROUP2_SUPER_MAGIC {
        bail!("--cgroup {}: not a cgroup-v2 directory (bpf_get_current_cgroup_id needs cgroup v2)", path.display());
    }
    Ok(fs::metadata(path)?.ino())
}

/// The level of a cgroup-v2 directory below its hierarchy's root (the root is 0): the
/// ancestor level at which the file layer finds the target (bpf_get_current_ancestor_cgroup_id).
pub fn cgroup_level(path: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    let path = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let Ok(dev) = fs::metadata(&path).map(|m| m.dev()) else { return 0 };
    path.ancestors().skip(1).take_while(|a| fs::metadata(a).is_ok_and(|m| m.dev() == dev)).count() as u32
}

/// One line of a mount's per-op RPC statistics in /proc/self/mountstats (statvers 1.1:
/// `OP: ops trans timeouts bytes_sent bytes_recv queue_ms rtt_ms execute_ms errors`; 1.0
/// has no errors). Times are cumulative milliseconds over all ops.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct OpStats {
    pub ops: u64,
    pub trans: u64,
    pub timeouts: u64,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub queue_ms: u64,
    pub rtt_ms: u64,
    pub execute_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<u64>,
}

/// One transport (`xprt:` line; several with nconnect), counters named as
/// net/sunrpc/xprtsock.c prints them for tcp and udp; other transports keep them raw.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Xprt {
    pub proto: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub raw: Vec<u64>,
}

/// The counters of an NFS mount at one moment.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct NfsSnapshot {
    /// Seconds since the mount was made.
    pub age_s: u64,
    /// The `bytes:` line (normalreadbytes … writepages).
    pub bytes: BTreeMap<String, u64>,
    pub xprts: Vec<Xprt>,
    /// Per RPC procedure (`READ`, `WRITE`, `COMMIT`, `GETATTR`, …).
    pub ops: BTreeMap<String, OpStats>,
}

/// An NFS mount as /proc/self/mountstats describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct NfsMountStats {
    pub source: String,
    pub mount_point: String,
    pub fstype: String,
    pub statvers: String,
    pub opts: String,
    pub now: NfsSnapshot,
}

const BYTES_NAMES: [&str; 8] = [
    "normal_read",
    "normal_write",
    "direct_read",
    "direct_write",
    "server_read",
    "server_write",
    "read_pages",
    "write_pages",
];
const TCP_NAMES: [&str; 13] = [
    "port",
    "bind_count",
    "connect_count",
    "connect_time",
    "idle_time",
    "sends",
    "recvs",
    "bad_xids",
    "req_u",
    "backlog_u",
    "max_slots",
    "sending_u",
    "pending_u",
];
const UDP_NAMES: [&str; 10] =
    ["port", "bind_count", "sends", "recvs", "bad_xids", "req_u", "backlog_u", "max_slots", "sending_u", "pending_u"];

fn numbers(s: &str) -> Vec<u64> {
    s.split_whitespace().filter_map(|w| w.parse().ok()).collect()
}

/// The NFS mounts of a mountstats text (other filesystems print only their `device` line).
pub fn parse_mountstats(text: &str) -> Vec<NfsMountStats> {
    let mut out: Vec<NfsMountStats> = Vec::new();
    let mut in_ops = false;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("device ") {
            in_ops = false;
            // device SOURCE mounted on POINT with fstype TYPE [statvers=V]
            let Some((source, rest)) = rest.split_once(" mounted on ") else { continue };
            let Some((point, rest)) = rest.rsplit_once(" with fstype ") else { continue };
            let mut words = rest.split_whitespace();
            let fstype = words.next().unwrap_or("").to_string();
            let statvers = words.find_map(|w| w.strip_prefix("statvers=")).unwrap_or("").to_string();
            if fstype.starts_with("nfs") && !statvers.is_empty() {
                out.push(NfsMountStats {
                    source: source.to_string(),
                    mount_point: point.to_string(),
                    fstype,
                    statvers,
                    opts: String::new(),
                    now: NfsSnapshot::default(),
                });
            }
            continue;
        }
        let Some(m) = out.last_mut() else { continue };
        let t = line.trim();
        if t == "per-op statistics" {
            in_ops = true;
        } else if let Some(v) = t.strip_prefix("opts:") {
            m.opts = v.trim().to_string();
        } else if let Some(v) = t.strip_prefix("age:") {
            m.now.age_s = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = t.strip_prefix("bytes:") {
            m.now.bytes = BYTES_NAMES.iter().map(|n| n.to_string()).zip(numbers(v)).collect();
        } else if let Some(v) = t.strip_prefix("xprt:") {
            let mut words = v.split_whitespace();
            let proto = words.next().unwrap_or("").to_string();
            let vals: Vec<u64> = words.filter_map(|w| w.parse().ok()).collect();
            let names: &[&str] = match proto.as_str() {
                "tcp" => &TCP_NAMES,
                "udp" => &UDP_NAMES,
                _ => &[],
            };
            let (counters, raw) = if names.is_empty() || vals.len() < names.len() {
                (BTreeMap::new(), vals)
            } else {
                (names.iter().map(|n| n.to_string()).zip(vals).collect(), Vec::new())
            };
            m.now.xprts.push(Xprt { proto, counters, raw });
        } else if in_ops {
            if let Some((op, v)) = t.split_once(':') {
                let n = numbers(v);
                if n.len() >= 8 {
                    m.now.ops.insert(
                        op.trim().to_string(),
                        OpStats {
                            ops: n[0],
                            trans: n[1],
                            timeouts: n[2],
                            bytes_sent: n[3],
                            bytes_recv: n[4],
                            queue_ms: n[5],
                            rtt_ms: n[6],
                            execute_ms: n[7],
                            errors: n.get(8).copied(),
                        },
                    );
                }
            }
        }
    }
    out
}

/// The NFS mounts this process sees now.
pub fn nfs_mountstats() -> Vec<NfsMountStats> {
    parse_mountstats(&fs::read_to_string("/proc/self/mountstats").unwrap_or_default())
}

/// `MAJ:MIN` of the mount at `mount_point` in /proc/self/mountinfo (the last one: the
/// visible one when mounts are stacked).
pub fn mount_dev(mount_point: &str) -> Option<String> {
    mounts().into_iter().rev().find(|(_, m)| m.mount_point == mount_point).map(|(d, _)| d)
}

/// The cgroup path in the text of /proc/PID/cgroup: the first of v2's `0::PATH`, v1's
/// blkio (the I/O controller), v1's `name=systemd` and any other hierarchy's that is not
/// the root (a hybrid host keeps every process at v2's root); else the root.
pub fn cgroup_path(text: &str) -> Option<String> {
    let lines: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some((if id == "0" && controllers.is_empty() { "v2" } else { controllers }, path))
        })
        .collect();
    let first = lines.first()?;
    let below_root =
        |want: &dyn Fn(&str) -> bool| lines.iter().find(|(c, p)| want(c) && *p != "/").map(|(_, p)| p.to_string());
    below_root(&|c| c == "v2")
        .or_else(|| below_root(&|c| c.split(',').any(|x| x == "blkio")))
        .or_else(|| below_root(&|c| c == "name=systemd"))
        .or_else(|| below_root(&|_| true))
        .or_else(|| Some(first.1.to_string()))
}

/// The cgroup of process `pid` as [`cgroup_path`] reads it from /proc/PID/cgroup; None
/// when the process is gone.
pub fn cgroup_of(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok().and_then(|text| cgroup_path(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_and_cmdline_of_a_process() {
        let stat = "4242 (pt_data (worker) 1) S 4100 4242 4100 0 -1 4194560 1 0 0 0";
        assert_eq!(parse_stat(stat), Some((4100, "pt_data (worker) 1".to_string())));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(cmdline_string(b"python\0train.py\0--epochs\x003\0"), "python train.py --epochs 3");
        assert_eq!(cmdline_string(b""), "");
        let long: Vec<u8> = std::iter::repeat_n("é".bytes(), 200).flatten().collect();
        let cut = cmdline_string(&long);
        assert_eq!(cut.len(), 254, "cut on a character boundary at most 255 bytes in");
        let me = proc_info(std::process::id()).unwrap();
        assert_eq!(me.ppid, unsafe { libc::getppid() } as u32);
        assert!(!me.cmdline.is_empty());
    }

    #[test]
    fn descendants_are_children_and_grandchildren_not_the_root_or_others() {
        // sh -> (sh -> sleep) and sh -> sleep: three descendants, two generations deep.
        let mut sh =
            std::process::Command::new("sh").args(["-c", "(sleep 30; true) & sleep 30 & wait"]).spawn().unwrap();
        let root = sh.id();
        let comms_of = |found: &[u32]| -> Vec<String> {
            found
                .iter()
                .map(|p| fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default().trim().to_string())
                .collect()
        };
        // Until the forks have exec'd sleep: a forked child is named sh until its exec.
        let (mut found, mut comms) = (Vec::new(), Vec::new());
        for _ in 0..250 {
            found = descendants(root);
            comms = comms_of(&found);
            if found.len() >= 3 && comms.iter().filter(|c| *c == "sleep").count() >= 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = std::process::Command::new("pkill").args(["-KILL", "-P", &root.to_string()]).status();
        for p in &found {
            let _ = std::process::Command::new("pkill").args(["-KILL", "-P", &p.to_string()]).status();
        }
        let _ = sh.kill();
        let _ = sh.wait();
        assert_eq!(found.len(), 3, "{found:?} {comms:?}");
        assert!(!found.contains(&root));
        assert_eq!(comms.iter().filter(|c| *c == "sleep").count(), 2, "{comms:?}");
        assert!(!descendants(root).contains(&std::process::id()), "not its parent");
    }

    /// Trimmed from the guest's /proc/self/mountstats (6.1, a vers=4.1 and a vers=3 mount).
    const MOUNTSTATS: &str = "device rootfs mounted on / with fstype rootfs
device proc mounted on /proc with fstype proc
device 127.0.0.1:/export mounted on /mnt/nfs41 with fstype nfs4 statvers=1.1
\topts:\trw,vers=4.1,rsize=262144,wsize=262144,namlen=255,acregmin=3,acregmax=60,acdirmin=30,acdirmax=60,hard,proto=tcp,nconnect=2,timeo=600,retrans=2,sec=sys,clientaddr=127.0.0.1,local_lock=none
\tage:\t17
\tcaps:\tcaps=0x3ffbffff,wtmult=512,dtsize=1048576,bsize=0,namlen=255
\tsec:\tflavor=1,pseudoflavor=1
\tevents:\t0 10 0 0 2 4 14 0 0 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
\tbytes:\t0 0 8388608 8388608 8388608 8388608 0 0
\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)
\txprt:\ttcp 0 0 1 0 0 75 75 0 75 0 2 0 0
\txprt:\ttcp 0 0 1 0 0 66 66 0 66 0 2 0 0
\tper-op statistics
\t        NULL: 1 1 0 44 24 0 0 0 0
\t        READ: 129 130 1 26832 8409240 2 310 330 0
\t       WRITE: 128 128 0 8416256 18432 1 401 410 0

device 127.0.0.1:/export mounted on /mnt/nfs\\0403 with fstype nfs statvers=1.1
\topts:\trw,vers=3,rsize=262144,wsize=262144,proto=udp
\tage:\t16
\tbytes:\t1 2 3 4 5 6 7 8
\tRPC iostats version: 1.0  p/v: 100003/3 (nfs)
\txprt:\tudp 0 0 1 1 0 1 0 2 0 0
\txprt:\trdma 0 0 1 2 3
\tper-op statistics
\t        READ: 3 3 0 100 200 1 2 3
";

    #[test]
    fn mountstats_nfs_mounts_with_named_counters() {
        let m = parse_mountstats(MOUNTSTATS);
        assert_eq!(m.len(), 2, "rootfs and proc are not NFS");
        let v4 = &m[0];
        assert_eq!(
            (v4.source.as_str(), v4.mount_point.as_str(), v4.fstype.as_str()),
            ("127.0.0.1:/export", "/mnt/nfs41", "nfs4")
        );
        assert_eq!(v4.statvers, "1.1");
        assert!(v4.opts.contains("nconnect=2"));
        assert_eq!(v4.now.age_s, 17);
        assert_eq!(v4.now.bytes["direct_read"], 8388608);
        assert_eq!(v4.now.xprts.len(), 2);
        assert_eq!(v4.now.xprts[1].counters["sends"], 66);
        assert_eq!(v4.now.xprts[0].counters["pending_u"], 0);
        let read = &v4.now.ops["READ"];
        assert_eq!(
            (read.ops, read.trans, read.timeouts, read.bytes_recv, read.rtt_ms, read.execute_ms),
            (129, 130, 1, 8409240, 310, 330)
        );
        assert_eq!(read.errors, Some(0));
        let v3 = &m[1];
        assert_eq!(v3.mount_point, "/mnt/nfs\\0403", "escaped as in mountinfo, to be joined with it");
        assert_eq!(v3.now.xprts[0].counters["recvs"], 1);
        assert_eq!(v3.now.xprts[1].raw, vec![0, 0, 1, 2, 3], "unknown transports keep raw numbers");
        assert_eq!(v3.now.ops["READ"].errors, None, "statvers 1.0 lines have 8 numbers");
    }
}
