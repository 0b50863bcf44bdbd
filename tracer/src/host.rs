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
    let sys = if let Some((ma, mi)) = parse_majmin(spec) {
        PathBuf::from(format!("/sys/dev/block/{ma}:{mi}"))
    } else {
        let name = spec.trim_start_matches("/dev/");
        PathBuf::from(format!("/sys/class/block/{name}"))
    };
    let sys = fs::canonicalize(&sys)
        .map_err(|_| anyhow::anyhow!("--dev {spec}: no such block device"))?;
    let disk = if sys.join("partition").exists() { sys.parent().unwrap().to_path_buf() } else { sys };
    let devstr = fs::read_to_string(disk.join("dev")).with_context(|| format!("--dev {spec}: reading {}", disk.display()))?;
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

/// The disk a `MAJ:MIN` belongs to (itself unless it is a partition).
fn disk_of(majmin: &str) -> String {
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
        let size_bytes = fs::read_to_string(sys.join("size")).ok().and_then(|s| s.trim().parse::<u64>().ok()).map(|s| s * 512);
        let backing_file = fs::read_to_string(sys.join("loop/backing_file")).ok().map(|s| s.trim().to_string());
        let mounts = all_mounts
            .iter()
            .filter(|(m, _)| m == dev || disk_of(m) == dev)
            .map(|(_, m)| m.clone())
            .collect();
        out.insert(dev.to_string(), DeviceInfo { dev: dev.to_string(), name, size_bytes, backing_file, mounts });
    }
    out.into_values().collect()
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
        bail!("tracefs is not mounted and mounting it on /sys/kernel/tracing failed: {}", std::io::Error::last_os_error());
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
