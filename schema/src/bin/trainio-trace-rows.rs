//! Reads a trace with the Rust reader (`trainio_schema::read_rows`) and prints its rows,
//! one JSON object per line, in the trace's order; or with `--count`, the number of rows.
//! The reader's own test driver: tests/analysis run the same traces through it and
//! through the Python reader. A trace that cannot be read is one line on stderr naming
//! the file, exit status 2.
//!
//!   trainio-trace-rows [--count] TRACE
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use serde_json::json;
use trainio_schema::{read_rows, OwnedRow};

fn row_json(r: &OwnedRow) -> serde_json::Value {
    json!({
        "layer": r.layer.as_str(), "op": &*r.op, "issue_ns": r.issue_ns, "complete_ns": r.complete_ns,
        "insert_ns": r.insert_ns, "dev": r.dev.as_deref(), "offset": r.offset, "bytes": r.bytes,
        "bytes_requested": r.bytes_requested, "queue_depth": r.queue_depth, "pid": r.pid, "tid": r.tid,
        "comm": &*r.comm, "fd": r.fd, "file": r.file.as_deref(), "error": r.error, "flags": r.flags,
        "rpc_xid": r.rpc.map(|x| x.xid), "rpc_backlog_ns": r.rpc.map(|x| x.backlog_ns),
        "rpc_rtt_ns": r.rpc.map(|x| x.rtt_ns), "rpc_execute_ns": r.rpc.map(|x| x.execute_ns),
        "rpc_retrans": r.rpc.and_then(|x| x.retrans), "ppid": r.ppid,
        "endpoint": r.object.as_ref().map(|o| &*o.endpoint),
        "http_status": r.object.as_ref().and_then(|o| o.http_status),
        "first_byte_ns": r.object.as_ref().and_then(|o| o.first_byte_ns),
    })
}

fn main() {
    // the reader turns a decoder's panic into the file's error: no panic message besides
    trainio_schema::quiet_decoder_panics();
    let mut count = false;
    let mut trace = None;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--count" => count = true,
            "-h" | "--help" => {
                println!("usage: trainio-trace-rows [--count] TRACE");
                return;
            }
            _ if trace.is_none() => trace = Some(PathBuf::from(arg)),
            _ => {
                eprintln!(
                    "trainio-trace-rows: unexpected argument {arg:?} (usage: trainio-trace-rows [--count] TRACE)"
                );
                std::process::exit(2);
            }
        }
    }
    let Some(trace) = trace else {
        eprintln!("trainio-trace-rows: no trace given (usage: trainio-trace-rows [--count] TRACE)");
        std::process::exit(2);
    };
    let rows = match read_rows(&trace, None) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("trainio-trace-rows: {}", trainio_schema::one_line(&e.to_string()));
            std::process::exit(2);
        }
    };
    let mut out = BufWriter::new(std::io::stdout().lock());
    let written = if count {
        writeln!(out, "{}", rows.len())
    } else {
        rows.iter().try_for_each(|r| writeln!(out, "{}", row_json(r)))
    };
    if written.and_then(|_| out.flush()).is_err() {
        std::process::exit(0); // a closed pipe: the reader went away
    }
}
