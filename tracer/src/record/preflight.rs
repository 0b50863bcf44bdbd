//! The checks before anything is loaded or written: the options against each other, root
//! and BTF, the layers, the devices, the output directory and the subject (a command, a
//! pid, a cgroup or every process). A failure here is bad input (exit 2).
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Result;
use trainio_schema::Layer;

use crate::cli::{usage, Args};
use crate::host;
use crate::probes::{Settings, Target};

/// What is being traced, as the user gave it.
pub(super) enum Subject {
    Command(Vec<OsString>),
    Pid(u32),
    Cgroup(PathBuf),
    All,
}

/// Resolves a command name the way execvp will, so a typo fails before any probe loads.
fn find_program(name: &OsString) -> Option<PathBuf> {
    let p = Path::new(name);
    if p.components().count() > 1 {
        return is_executable(p).then(|| p.to_path_buf());
    }
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).map(|d| d.join(p)).find(|c| is_executable(c)))
        .unwrap_or(None)
}

/// A regular file that exec may run, as execvp searches PATH for one.
fn is_executable(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else { return false };
    p.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
}

pub(super) struct Checked {
    pub(super) block: bool,
    pub(super) file: bool,
    pub(super) nfs: bool,
    pub(super) object: bool,
    pub(super) devs: Vec<(u32, String)>,
    pub(super) subject: Subject,
    pub(super) target: Target,
    pub(super) ringbuf_bytes: u32,
    /// The interval of the progress lines (TRAINIO_PROGRESS_S).
    pub(super) progress_every: std::time::Duration,
    /// libssl files to probe besides the linker cache's.
    pub(super) tls_libs: Vec<PathBuf>,
}

impl Checked {
    /// What the probes load: the layers, devices and subject checked, and the options
    /// that tune them.
    pub(super) fn settings(&self, args: &Args) -> Settings {
        Settings {
            block: self.block,
            file: self.file,
            object: self.object,
            nfs: self.nfs,
            devs: self.devs.iter().map(|(d, _)| *d).collect(),
            ringbuf_bytes: self.ringbuf_bytes,
            target: self.target.clone(),
            bpf_stats: !args.no_bpf_stats,
            io_uring: args.io_uring,
            tls_libs: self.tls_libs.clone(),
        }
    }
}

/// A failed lookup of something the user named is bad input (exit 2).
pub(super) fn as_usage(e: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(crate::cli::Usage(format!("{e:#}")))
}

/// `--per-host`: this host's trace in the set `set` is `set/HOSTNAME` (SCHEMA.md, *Trace
/// sets*). The set directory may hold other hosts' traces, not a trace of its own.
pub(super) fn per_host_output(set: &Path) -> Result<PathBuf> {
    let host = host::hostname();
    if host.is_empty() || host.contains('/') || host == "." || host == ".." {
        usage!("--per-host: this host's name {host:?} cannot name a directory");
    }
    // One look at the path: the other hosts' recorders create it at the same time (it does
    // not exist, then it is a directory), so asking twice could see each in turn.
    match std::fs::metadata(set) {
        Ok(m) if m.is_dir() => {
            let own = std::fs::read_dir(set)?
                .filter_map(|e| e.ok())
                .any(|e| e.file_name().to_str().is_some_and(trainio_schema::is_segment_name));
            if own {
                usage!(
                    "--output {}: holds a trace of its own, so it cannot be a set of per-host traces",
                    set.display()
                );
            }
        }
        Ok(_) => usage!("--output {}: exists and is not a directory", set.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => usage!("--output {}: {e}", set.display()),
    }
    Ok(set.join(host))
}

/// Every check that can fail on bad input, before anything is loaded or written.
pub(super) fn preflight(args: &Args) -> Result<Checked> {
    if let Some(mb) = args.retain_mb.filter(|&mb| mb < args.segment_mb) {
        usage!(
            "--retain-mb {mb} is below --segment-mb {}: retention keeps whole segments (lower --segment-mb)",
            args.segment_mb
        );
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        usage!("must run as root: loading BPF programs needs CAP_BPF and CAP_PERFMON (try sudo)");
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        usage!("this kernel has no BTF (/sys/kernel/btf/vmlinux missing): CONFIG_DEBUG_INFO_BTF=y is needed");
    }
    let (mut block, mut file, mut nfs, mut object) = (false, false, false, false);
    for l in &args.layers {
        match Layer::parse(l.trim()) {
            Some(Layer::Block) => block = true,
            Some(Layer::File) => file = true,
            Some(Layer::Nfs) => nfs = true,
            Some(Layer::Object) => object = true,
            // Recorded with the file layer, not chosen on their own.
            Some(Layer::Proc | Layer::Ipc) | None => {
                usage!("--layers: unknown layer `{l}` (known: block, file, nfs, object)")
            }
        }
    }
    if object && !file {
        usage!(
            "--layers: object is recorded from the file layer's socket probes: add file (e.g. --layers file,object)"
        );
    }
    if args.io_uring && !file {
        usage!("--io-uring: io_uring requests are recorded at the file layer, which --layers leaves out");
    }
    let mut devs = Vec::new();
    for d in &args.devs {
        devs.push(host::resolve_block_device(d).map_err(as_usage)?);
    }
    let out = &args.output;
    if out.exists() {
        if !out.is_dir() {
            usage!("--output {}: exists and is not a directory", out.display());
        }
        if std::fs::read_dir(out)?.next().is_some() {
            usage!("--output {}: directory is not empty (a trace is never written over another)", out.display());
        }
    }
    // The nearest directory that exists must take new entries (a read-only mount does not,
    // even for root): said now rather than after the probes are loaded.
    let cwd = Path::new(".");
    if let Some(dir) = out.ancestors().map(|a| if a.as_os_str().is_empty() { cwd } else { a }).find(|a| a.is_dir()) {
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap_or_default();
        // SAFETY: c is a NUL-terminated path.
        if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
            usage!(
                "--output {}: {} is not writable: {}",
                out.display(),
                dir.display(),
                std::io::Error::last_os_error()
            );
        }
    }
    let (subject, target) = if !args.command.is_empty() {
        if find_program(&args.command[0]).is_none() {
            let (name, path) = (args.command[0].to_string_lossy(), Path::new(&args.command[0]));
            if path.components().count() > 1 && path.exists() {
                usage!("{name}: not an executable file");
            }
            usage!("command not found: {name}");
        }
        (Subject::Command(args.command.clone()), Target::Tgids)
    } else if let Some(pid) = args.pid {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            usage!("--pid {pid}: no such process");
        }
        (Subject::Pid(pid), Target::Tgids)
    } else if let Some(cg) = &args.cgroup {
        let id = host::cgroup_id(cg).map_err(as_usage)?;
        (Subject::Cgroup(cg.clone()), Target::Cgroup(id, host::cgroup_level(cg)))
    } else {
        (Subject::All, Target::All)
    };
    let bytes = (args.ringbuf_mb * 1048576.0).ceil().max(4096.0);
    if bytes > (1u64 << 31) as f64 {
        usage!("--ringbuf-mb {}: at most 2048", args.ringbuf_mb);
    }
    let ringbuf_bytes = (bytes as u32).next_power_of_two();
    let progress_every = match super::progress::interval() {
        Ok(every) => every,
        Err(why) => usage!("{why}"),
    };
    let tls_libs = tls_libs(args, object, &subject)?;
    Ok(Checked { block, file, nfs, object, devs, subject, target, ringbuf_bytes, progress_every, tls_libs })
}

/// The libssl files to probe besides the linker cache's: each --tls-lib (a regular file,
/// by its real path; the object layer must be on), and with --pid each libssl the target
/// and its descendants have mapped now.
fn tls_libs(args: &Args, object: bool, subject: &Subject) -> Result<Vec<PathBuf>> {
    if !args.tls_lib.is_empty() && !object {
        usage!("--tls-lib: HTTPS requests are recorded by the object layer: add it (e.g. --layers file,object)");
    }
    let mut libs = Vec::new();
    for lib in &args.tls_lib {
        match std::fs::canonicalize(lib) {
            Ok(real) if real.is_file() => libs.push(real),
            Ok(_) => usage!("--tls-lib {}: not a file", lib.display()),
            Err(e) => usage!("--tls-lib {}: {e}", lib.display()),
        }
    }
    if let (true, Subject::Pid(pid)) = (object, subject) {
        let pids: Vec<u32> = std::iter::once(*pid).chain(host::descendants(*pid)).collect();
        libs.extend(crate::probes::mapped_libssl(&pids));
    }
    Ok(libs)
}
