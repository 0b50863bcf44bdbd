//! `trainio record`: eBPF block-layer and file-level tracing into a Parquet trace.
mod cli;
mod encoder;
mod events;
mod host;
mod metrics;
mod object;
mod probes;
mod record;

mod block_skel {
    #![allow(unused_imports)]
    include!(concat!(env!("OUT_DIR"), "/block.skel.rs"));
}
mod file_skel {
    #![allow(unused_imports)]
    include!(concat!(env!("OUT_DIR"), "/file.skel.rs"));
}
mod nfs_skel {
    #![allow(unused_imports)]
    include!(concat!(env!("OUT_DIR"), "/nfs.skel.rs"));
}

/// The skeletons and the event types of bpf/trainio.h, generated at build time.
mod bpf {
    pub use crate::block_skel::{
        types::block_event, types::block_pending, types::dev_state, types::req_state, BlockSkel, BlockSkelBuilder,
    };
    pub use crate::file_skel::types::{file_event, open_event, trainio_file_op, trainio_kind};
    pub use crate::file_skel::types::{
        http_event, ipc_event, process_event, trainio_ipc_op, trainio_ipc_type, trainio_proc_op,
    };
    pub use crate::file_skel::{FileSkel, FileSkelBuilder};
    pub use crate::nfs_skel::types::{nfs_event, trainio_nfs_op, trainio_rpc_flags};
    pub use crate::nfs_skel::{NfsSkel, NfsSkelBuilder};
    // SAFETY: plain-old-data structs generated from bpf/trainio.h.
    unsafe impl plain::Plain for block_event {}
    unsafe impl plain::Plain for file_event {}
    unsafe impl plain::Plain for open_event {}
    unsafe impl plain::Plain for nfs_event {}
    unsafe impl plain::Plain for process_event {}
    unsafe impl plain::Plain for ipc_event {}
}

use clap::Parser;

fn main() {
    // The drain fills, and the encoder frees, column buffers of a few hundred KiB every
    // batch. glibc would map and unmap each (above its 128 KiB mmap threshold), so every
    // batch page-faulted ~11 MiB of fresh zeroed memory: ~60 ns per event at 250k events/s.
    // Served from the heap and kept there instead, they are reused.
    // SAFETY: mallopt only tunes the allocator; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
    let args = cli::Args::parse();
    match record::run(args) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("trainio record: {e:#}");
            let bad_input = e.chain().any(|c| c.is::<cli::Usage>());
            std::process::exit(if bad_input { 2 } else { 1 });
        }
    }
}
