//! The object layer's TLS probes (bpf/file_tls.bpf.h): uprobes on OpenSSL 3's read and
//! write functions in each libssl the linker resolves, so that HTTPS requests are read in
//! plaintext (docs/design/object-storage.md).

use std::collections::BTreeMap;

use anyhow::Context;
use libbpf_rs::Link;

use crate::bpf::FileSkel;

/// SEC("uprobe") and SEC("uretprobe"): the object layer's TLS probes (bpf/file_tls.bpf.h).
pub(super) fn is_uprobe(section: &str) -> bool {
    section.starts_with("uprobe") || section.starts_with("uretprobe")
}

/// The TLS read and write functions and their entry probes; one return probe serves all.
const TLS_FUNCTIONS: [&str; 4] = ["SSL_read", "SSL_read_ex", "SSL_write", "SSL_write_ex"];

/// The libssl files to probe: the OpenSSL 3 `libssl.so.3` the dynamic linker resolves for
/// a program without its own search path (`ldconfig -p`: the one Python's `_ssl` module
/// and Debian's packages load), by its real path, deduplicated. A process that loads
/// another libssl (one bundled in a wheel, a static build) is not seen.
pub(super) fn tls_libraries() -> Vec<std::path::PathBuf> {
    // By path first: the recorder's PATH may well lack the sbin directories.
    let listed = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
        .iter()
        .find_map(|l| std::process::Command::new(l).arg("-p").output().ok().filter(|o| o.status.success()))
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut out: Vec<std::path::PathBuf> = Vec::new();
    for line in listed.lines() {
        let Some((name, path)) = line.trim().split_once(" => ") else { continue };
        // The 64-bit library of this machine's ABI, not a 32-bit one beside it.
        let this_abi = !cfg!(target_arch = "x86_64") || name.contains("x86-64");
        if !name.starts_with("libssl.so.3 ") || !this_abi {
            continue;
        }
        if let Ok(real) = std::fs::canonicalize(path.trim()) {
            if !out.contains(&real) {
                out.push(real);
            }
        }
    }
    out
}

/// The libssl files (`libssl.so*`, by real path) that processes `pids` have mapped: a
/// running target's own OpenSSL, which may not be the linker cache's (a conda
/// environment's, one bundled in a wheel). A process that is gone is passed over.
pub fn mapped_libssl(pids: &[u32]) -> Vec<std::path::PathBuf> {
    let mut out: Vec<std::path::PathBuf> = Vec::new();
    for pid in pids {
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { continue };
        for path in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
            let name = std::path::Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !name.starts_with("libssl.so") {
                continue;
            }
            if let Ok(real) = std::fs::canonicalize(path) {
                if !out.contains(&real) {
                    out.push(real);
                }
            }
        }
    }
    out
}

/// Attaches the TLS uprobes to each library (all processes that map it: a uprobe is on
/// the file; the programs keep the traced ones). A library without the functions is
/// noted in `skipped`, as is finding none: HTTPS requests are then not recorded.
pub(super) fn attach_tls(
    f: &FileSkel,
    libs: &[std::path::PathBuf],
    links: &mut Vec<Link>,
    skipped: &mut BTreeMap<String, String>,
) {
    if libs.is_empty() {
        skipped.insert("tls".into(), "no libssl.so.3 in the linker cache: HTTPS requests not recorded".into());
    }
    let p = &f.progs;
    let entries = [&p.tio_ssl_read_enter, &p.tio_ssl_read_ex_enter, &p.tio_ssl_write_enter, &p.tio_ssl_write_ex_enter];
    for lib in libs {
        let mut these = Vec::new();
        let attached = TLS_FUNCTIONS.iter().zip(entries).try_for_each(|(func, entry)| {
            for (prog, retprobe) in [(entry, false), (&p.tio_ssl_return, true)] {
                let opts = libbpf_rs::UprobeOpts { retprobe, func_name: Some((*func).into()), ..Default::default() };
                these.push(prog.attach_uprobe_with_opts(-1, lib, 0, opts).with_context(|| func.to_string())?);
            }
            Ok::<_, anyhow::Error>(())
        });
        match attached {
            Ok(()) => links.extend(these),
            Err(e) => {
                skipped.insert(
                    format!("tls:{}", lib.display()),
                    format!("not probed ({e:#}): its HTTPS requests not recorded"),
                );
            }
        }
    }
}
