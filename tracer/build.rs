//! Compiles bpf/*.bpf.c into skeletons. vmlinux.h is generated from the build machine's
//! BTF with bpftool: CO-RE relocations make the objects portable to other kernels.
use std::env;
use std::path::PathBuf;
use std::process::Command;

use libbpf_cargo::SkeletonBuilder;

const PROBES: &[&str] = &["block", "file", "nfs"];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let bpf_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap()).join("../bpf");
    let vmlinux = out.join("vmlinux.h");
    let btf = env::var("TRAINIO_BTF").unwrap_or_else(|_| "/sys/kernel/btf/vmlinux".into());
    let dump = Command::new("bpftool")
        .args(["btf", "dump", "file", &btf, "format", "c"])
        .output()
        .expect("running bpftool (apt-get install bpftool) to generate vmlinux.h");
    assert!(dump.status.success(), "bpftool btf dump {btf} failed: {}", String::from_utf8_lossy(&dump.stderr));
    std::fs::write(&vmlinux, dump.stdout).expect("writing vmlinux.h");
    println!("cargo:rerun-if-env-changed=TRAINIO_BTF");
    println!("cargo:rerun-if-changed={}", bpf_dir.join("trainio.h").display());
    println!("cargo:rerun-if-changed={}", bpf_dir.join("common.bpf.h").display());
    println!("cargo:rerun-if-changed={}", bpf_dir.join("core_fixes.bpf.h").display());
    for header in ["file_ipc", "file_mmap", "file_open", "file_proc", "file_tls", "file_uring"] {
        println!("cargo:rerun-if-changed={}", bpf_dir.join(format!("{header}.bpf.h")).display());
    }

    for probe in PROBES {
        let src = bpf_dir.join(format!("{probe}.bpf.c"));
        let skel = out.join(format!("{probe}.skel.rs"));
        SkeletonBuilder::new()
            .source(&src)
            .clang_args([
                "-I".as_ref(),
                out.as_os_str(),
                "-I".as_ref(),
                bpf_dir.as_os_str(),
                "-O2".as_ref(),
                // v3: atomic fetch-and-add with a return value (kernel >= 5.12)
                "-mcpu=v3".as_ref(),
                "-g".as_ref(),
                "-Wall".as_ref(),
            ])
            .build_and_generate(&skel)
            .unwrap_or_else(|e| panic!("building {}: {e:#}", src.display()));
        println!("cargo:rerun-if-changed={}", src.display());
    }
}
