//! The trainio trace format (traces/SCHEMA.md), version 1.9: the one Rust module that knows
//! its columns, types and metadata keys. The tracer writes through [`TraceWriter`]; the
//! replayer reads through [`read_rows`], the job model through [`read_batches`] and
//! [`RowDecoder`] (which also decode batches the analyzer hands it).
//!
//! A trace is a directory of numbered segments. A segment is written as
//! `seg-NNNNNN.parquet.partial` and renamed when closed, so every `.parquet` file in a
//! trace is complete even if the writer was killed.

mod batch;
mod encoding;
mod read;
mod segment;
mod set;
mod write;

pub use batch::{BatchBuilder, RowKeys};
pub use read::{
    guard_decoder, is_segment_name, one_line, quiet_decoder_panics, read_batches, read_metadata, read_rows,
    segment_paths, BatchOrigin, BriefRow, OwnedRow, RowDecoder, TraceError,
};
pub use set::{open_trace_set, trace_set_members, Member, OpenMember};
pub use write::{Dropped, Retention, SegmentLimits, TraceWriter, RESERVE_NAME};

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef};

/// Value of `trainio.schema_version` written by this crate and the versions it reads.
pub const SCHEMA_VERSION: &str = "1";
/// Value of `trainio.schema_minor`: additions within version 1 (SCHEMA.md, *Versioning*).
/// 1: the `rpc_*` columns. 2: `trainio.recorder_cpu_ns`. 3: the `proc` and `ipc` layers
/// and the `ppid` column. 4: the file layer's `fsync`, `fdatasync` and `sync_file_range`
/// ops. 5: rows of more syscalls, no new op. 6: the file layer's `fault`, `map_pages`,
/// `mmap` and `madvise` ops (reads through memory mappings). 7: `trainio.retention`
/// (what a recording with retention removed) and `trainio.window` (what `trainio slice`
/// cut). 8: the `object` layer (HTTP object requests) and its columns `endpoint`,
/// `http_status` and `first_byte_ns`. 9: `trainio.end` (whether the recording ended or
/// was cut off: a killed recorder, a lost host) and the proc layer's `cgroup` op. A trace without the key is 1.0; readers
/// accept any minor.
pub const SCHEMA_MINOR: &str = "9";

/// Columns added by minor versions: a reader takes them as null when a trace lacks them.
pub const OPTIONAL_COLUMNS: [&str; 9] = [
    "rpc_xid",
    "rpc_backlog_ns",
    "rpc_rtt_ns",
    "rpc_execute_ns",
    "rpc_retrans",
    "ppid",
    "endpoint",
    "http_status",
    "first_byte_ns",
];

/// Metadata keys (Parquet key-value metadata, UTF-8 values; JSON where SCHEMA.md says).
pub mod keys {
    pub const SCHEMA_VERSION: &str = "trainio.schema_version";
    pub const SCHEMA_MINOR: &str = "trainio.schema_minor";
    pub const TRACER_VERSION: &str = "trainio.tracer_version";
    pub const HOSTNAME: &str = "trainio.hostname";
    pub const KERNEL_RELEASE: &str = "trainio.kernel_release";
    pub const CLOCK_OFFSET_NS: &str = "trainio.clock_offset_ns";
    pub const START_NS: &str = "trainio.start_ns";
    pub const END_NS: &str = "trainio.end_ns";
    pub const SEGMENT: &str = "trainio.segment";
    pub const LAYERS: &str = "trainio.layers";
    pub const SKIPPED_PROBES: &str = "trainio.skipped_probes";
    pub const TARGET: &str = "trainio.target";
    pub const DEVICES: &str = "trainio.devices";
    pub const LOST_EVENTS: &str = "trainio.lost_events";
    pub const BPF_STATS: &str = "trainio.bpf_stats";
    pub const EVENTS: &str = "trainio.events";
    pub const NFS_MOUNTS: &str = "trainio.nfs_mounts";
    pub const RECORDER_CPU_NS: &str = "trainio.recorder_cpu_ns";
    pub const RETENTION: &str = "trainio.retention";
    /// JSON `{"complete": bool, "reason": str}` (1.9): `complete` only in the segment a
    /// recorder closed as it ended; see [`crate::recording_complete`].
    pub const END: &str = "trainio.end";
    /// JSON (1.4): what `trainio import` read; only an imported trace has it.
    pub const SOURCE: &str = "trainio.source";
    /// JSON (1.7): the window `trainio slice` cut; only a sliced trace has it.
    pub const WINDOW: &str = "trainio.window";
    /// What every key starts with.
    pub const PREFIX: &str = "trainio.";

    use super::MetaValue::{Int, Json, Text};
    /// Every key and how its value is written (SCHEMA.md, *Metadata*).
    pub const ALL: [(&str, super::MetaValue); 22] = [
        (SCHEMA_VERSION, Int),
        (SCHEMA_MINOR, Int),
        (TRACER_VERSION, Text),
        (HOSTNAME, Text),
        (KERNEL_RELEASE, Text),
        (CLOCK_OFFSET_NS, Int),
        (START_NS, Int),
        (END_NS, Int),
        (SEGMENT, Int),
        // filled in from the rows when a writer is not told
        (LAYERS, Json("null")),
        (SKIPPED_PROBES, Json("{}")),
        (TARGET, Json(r#"{"all": true}"#)),
        (DEVICES, Json("[]")),
        (LOST_EVENTS, Json("{}")),
        (BPF_STATS, Json("{}")),
        // filled in from the rows when a writer is not told
        (EVENTS, Json("null")),
        (NFS_MOUNTS, Json("[]")),
        (RECORDER_CPU_NS, Json("{}")),
        (SOURCE, Json("{}")),
        (RETENTION, Json("{}")),
        (WINDOW, Json("{}")),
        (END, Json("{}")),
    ];
}

/// How a metadata key's value is written: text, a decimal integer, or JSON with the value
/// a writer that is not told writes (and a reader takes for an absent key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaValue {
    Text,
    Int,
    Json(&'static str),
}

/// Ops whose bytes are data transfers (throughput, request sizes).
pub const DATA_OPS: [&str; 2] = ["read", "write"];

/// Whether the trace whose last segment has this metadata ended as its writer meant it
/// to (SCHEMA.md, *The end of a recording*): `Some(false)` for a 1.9+ trace whose last
/// segment does not say `"complete": true` (its recorder was killed, its host went down,
/// or it is still recording), `None` for a trace before 1.9, which cannot say.
pub fn recording_complete(meta: &std::collections::HashMap<String, String>) -> Option<bool> {
    let minor: u32 = meta.get(keys::SCHEMA_MINOR).and_then(|m| m.trim().parse().ok()).unwrap_or(0);
    if minor < 9 {
        return None;
    }
    let end = meta.get(keys::END).and_then(|v| serde_json::from_str::<serde_json::Value>(v).ok());
    Some(end.is_some_and(|e| e.get("complete").and_then(|c| c.as_bool()) == Some(true)))
}

/// The layer a row was recorded at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layer {
    Block,
    File,
    Nfs,
    /// Process lifecycle of the traced processes: start, fork, exec, comm, exit (1.3).
    Proc,
    /// Reads, writes and polls of the traced processes on pipes, FIFOs and sockets (1.3).
    Ipc,
    /// HTTP object requests (S3) of the traced processes, from their socket syscalls (1.8).
    Object,
}

impl Layer {
    pub const ALL: [Layer; 6] = [Layer::Block, Layer::File, Layer::Nfs, Layer::Proc, Layer::Ipc, Layer::Object];

    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Block => "block",
            Layer::File => "file",
            Layer::Nfs => "nfs",
            Layer::Proc => "proc",
            Layer::Ipc => "ipc",
            Layer::Object => "object",
        }
    }

    /// The layers whose rows are storage I/O, the ones an analysis characterizes: proc and
    /// ipc rows describe the job's structure, object rows its requests to a store.
    pub const STORAGE: [Layer; 3] = [Layer::Block, Layer::File, Layer::Nfs];

    pub fn parse(s: &str) -> Option<Layer> {
        Layer::ALL.into_iter().find(|l| l.as_str() == s)
    }

    /// The ops whose rows count in this layer's queue depth (SCHEMA.md, `queue_depth`).
    pub fn qd_ops(self) -> &'static [&'static str] {
        match self {
            Layer::Block | Layer::Object => self.ops(),
            Layer::File | Layer::Nfs => &DATA_OPS,
            Layer::Proc | Layer::Ipc => &[],
        }
    }

    /// The ops a row of this layer may have (SCHEMA.md, *ops*).
    pub fn ops(self) -> &'static [&'static str] {
        match self {
            Layer::Block => &["read", "write", "flush", "discard", "write_zeroes", "other"],
            Layer::File => &[
                "read",
                "write",
                "open",
                "close",
                "fsync",
                "fdatasync",
                "sync_file_range",
                "fault",
                "map_pages",
                "mmap",
                "madvise",
            ],
            Layer::Nfs => &["read", "write", "commit"],
            Layer::Proc => &["start", "fork", "exec", "comm", "exit", "cgroup"],
            Layer::Ipc => &["read", "write", "wait"],
            Layer::Object => &["get", "put", "head", "post", "delete", "other"],
        }
    }
}

/// One row as the writer takes it: borrowed strings, no allocation per row.
#[derive(Clone, Debug)]
pub struct Row<'a> {
    pub layer: Layer,
    pub op: &'a str,
    pub issue_ns: i64,
    pub complete_ns: i64,
    pub insert_ns: Option<i64>,
    /// `"MAJ:MIN"`.
    pub dev: Option<&'a str>,
    pub offset: Option<i64>,
    pub bytes: i64,
    pub bytes_requested: i64,
    pub queue_depth: u32,
    pub pid: u32,
    pub tid: u32,
    pub comm: &'a str,
    pub fd: Option<i32>,
    pub file: Option<&'a str>,
    pub error: i32,
    pub flags: u32,
    /// The parent's tgid on proc rows (schema 1.3); None on every other layer.
    pub ppid: Option<u32>,
}

#[cfg(test)]
impl Row<'static> {
    /// One 4 KiB block read by `dd` on 0:30, for tests to vary with `..Row::sample()`.
    pub(crate) fn sample() -> Self {
        Row {
            layer: Layer::Block,
            op: "read",
            issue_ns: 10,
            complete_ns: 20,
            insert_ns: None,
            dev: Some("0:30"),
            offset: Some(0),
            bytes: 4096,
            bytes_requested: 4096,
            queue_depth: 1,
            pid: 1,
            tid: 1,
            comm: "dd",
            fd: None,
            file: None,
            error: 0,
            flags: 0,
            ppid: None,
        }
    }
}

/// The RPC that carried an NFS request (schema 1.1), as `sunrpc:rpc_stats_latency` and
/// `xprt_transmit` report it. Times have the kernel's microsecond resolution.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rpc {
    pub xid: u32,
    pub backlog_ns: i64,
    pub rtt_ns: i64,
    pub execute_ns: i64,
    /// Transmissions beyond the first; None when they were not counted.
    pub retrans: Option<u32>,
}

/// What an object-layer row has beyond the common columns (schema 1.8).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectFields<S = Arc<str>> {
    /// The server the request went to: `IP:PORT` (`[IPv6]:PORT`).
    pub endpoint: S,
    /// The response's status code; None when no response head arrived.
    pub http_status: Option<u32>,
    /// When the first byte of the response arrived (exit of the receive that returned it).
    pub first_byte_ns: Option<i64>,
}

fn dict(name: &str, key: DataType, nullable: bool) -> Field {
    Field::new(name, DataType::Dictionary(Box::new(key), Box::new(DataType::Utf8)), nullable)
}

/// The Arrow schema of a segment, column order as in SCHEMA.md.
pub fn arrow_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        dict("layer", DataType::Int8, false),
        dict("op", DataType::Int8, false),
        Field::new("issue_ns", DataType::Int64, false),
        Field::new("complete_ns", DataType::Int64, false),
        Field::new("insert_ns", DataType::Int64, true),
        dict("dev", DataType::Int16, true),
        Field::new("offset", DataType::Int64, true),
        Field::new("bytes", DataType::Int64, false),
        Field::new("bytes_requested", DataType::Int64, false),
        Field::new("queue_depth", DataType::UInt32, false),
        Field::new("pid", DataType::UInt32, false),
        Field::new("tid", DataType::UInt32, false),
        dict("comm", DataType::Int32, false),
        Field::new("fd", DataType::Int32, true),
        dict("file", DataType::Int32, true),
        Field::new("error", DataType::Int32, false),
        Field::new("flags", DataType::UInt32, false),
        Field::new("rpc_xid", DataType::UInt32, true),
        Field::new("rpc_backlog_ns", DataType::Int64, true),
        Field::new("rpc_rtt_ns", DataType::Int64, true),
        Field::new("rpc_execute_ns", DataType::Int64, true),
        Field::new("rpc_retrans", DataType::UInt32, true),
        Field::new("ppid", DataType::UInt32, true),
        dict("endpoint", DataType::Int16, true),
        Field::new("http_status", DataType::UInt32, true),
        Field::new("first_byte_ns", DataType::Int64, true),
    ]))
}

/// `"MAJ:MIN"` of a kernel-internal dev_t (major << 20 | minor).
pub fn dev_string(kernel_dev: u32) -> String {
    format!("{}:{}", kernel_dev >> 20, kernel_dev & ((1 << 20) - 1))
}
