//! Object requests as the model's data reads. A job that reads its samples from an object
//! store (boto3's `get_object`, s3torchconnector, minio) makes no file reads of them: its
//! samples are the bodies of HTTP GETs, recorded as `object` rows (schema 1.8,
//! traces/SCHEMA.md, *object rows*). The model counts each successful GET of an object
//! as a read of it, by the thread that sent the request: `file` the recorded
//! `bucket/key`, `offset` the Range's first byte (0 for the whole object), `bytes` the
//! body received, `queue_depth` the requests outstanding on the endpoint (the store's
//! queue depth), and `dev` the store, `s3://ENDPOINT/BUCKET`, so that the data source is
//! chosen among devices and object stores by the bytes read from each, as the devices
//! are among themselves. The request's latency is its issue to its last body byte.
//!
//! Not reads of data: requests that failed or were answered without a 2xx status,
//! other methods (PUT, HEAD, ...), and requests to a bucket alone (a path with no `/`:
//! ListObjects, HeadBucket). A request addressed virtual-hosted style is recorded with
//! the bucket its Host names as `bucket/key` too, when the recorder recognizes the host
//! as `BUCKET.s3...` (SCHEMA.md); otherwise its `file` is the key alone, and a key
//! without `/` is then taken for a bucket-level request.
//!
//! The rows made here keep their `object` fields, which is how the model and the replay
//! tell them from read syscalls.

use std::sync::Arc;

use trainio_schema::{Layer, OwnedRow};

/// The data source's name for an object store: `s3://ENDPOINT/BUCKET`.
pub const PREFIX: &str = "s3://";

/// Whether a file-layer row is an object request made a read here.
pub fn is_object_read(r: &OwnedRow) -> bool {
    r.layer == Layer::File && r.object.is_some()
}

/// The store a data source names: (endpoint, bucket), when it is one.
pub fn store_of(source: &str) -> Option<(&str, &str)> {
    source.strip_prefix(PREFIX)?.split_once('/')
}

/// The `read` rows of a trace's object rows (any order): one per successful GET of an
/// object, in the order of the rows given.
pub fn reads(object: &[OwnedRow]) -> Vec<OwnedRow> {
    object.iter().filter_map(read_of).collect()
}

fn read_of(r: &OwnedRow) -> Option<OwnedRow> {
    let o = r.object.as_ref()?;
    let ok = o.http_status.is_some_and(|s| (200..300).contains(&s));
    if &*r.op != "get" || !ok || r.error != 0 || r.bytes <= 0 {
        return None;
    }
    let path = r.file.as_deref()?;
    let (bucket, key) = path.split_once('/')?;
    if bucket.is_empty() || key.is_empty() {
        return None;
    }
    Some(OwnedRow {
        layer: Layer::File,
        op: Arc::from("read"),
        dev: Some(Arc::from(format!("{PREFIX}{}/{bucket}", o.endpoint))),
        offset: Some(r.offset.unwrap_or(0).max(0)),
        bytes_requested: r.bytes,
        ..r.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainio_schema::ObjectFields;

    fn get(file: &str, offset: Option<i64>, bytes: i64, status: Option<u32>) -> OwnedRow {
        OwnedRow {
            layer: Layer::Object,
            op: Arc::from("get"),
            issue_ns: 1_000,
            complete_ns: 5_000,
            insert_ns: None,
            dev: None,
            offset,
            bytes,
            bytes_requested: bytes,
            queue_depth: 3,
            pid: 7,
            tid: 8,
            comm: Arc::from("pt_data_worker"),
            fd: Some(9),
            file: Some(Arc::from(file)),
            error: 0,
            flags: 0,
            rpc: None,
            ppid: None,
            object: Some(ObjectFields {
                endpoint: Arc::from("127.0.0.1:9000"),
                http_status: status,
                first_byte_ns: Some(2_000),
            }),
        }
    }

    #[test]
    fn successful_gets_of_objects_are_reads_of_their_store() {
        let rows = vec![
            get("train/a/s0.bin", None, 4096, Some(200)),
            get("train/a/s1.bin", Some(1000), 500, Some(206)),
            get("train", None, 900, Some(200)),            // a listing of the bucket
            get("train/a/gone.bin", None, 300, Some(404)), // the error document
            get("train/a/cut.bin", None, 100, None),       // no response head
            OwnedRow { op: Arc::from("put"), ..get("train/a/p.bin", None, 10, Some(200)) },
            OwnedRow { error: -61, ..get("train/a/s2.bin", None, 10, Some(200)) },
        ];
        let reads = reads(&rows);
        assert_eq!(reads.len(), 2, "{reads:?}");
        let (whole, ranged) = (&reads[0], &reads[1]);
        assert_eq!(whole.layer, Layer::File);
        assert_eq!(&*whole.op, "read");
        assert_eq!(whole.dev.as_deref(), Some("s3://127.0.0.1:9000/train"));
        assert_eq!(whole.offset, Some(0), "a whole object is read from its first byte");
        assert_eq!((ranged.offset, ranged.bytes, ranged.bytes_requested), (Some(1000), 500, 500));
        assert_eq!((whole.pid, whole.tid, whole.queue_depth, whole.fd), (7, 8, 3, Some(9)));
        assert_eq!((whole.issue_ns, whole.complete_ns), (1_000, 5_000), "issue to last body byte");
        assert!(reads.iter().all(is_object_read));
        assert!(!crate::mapped::is_mapped_read(whole), "a socket's fd: not a mapped read");
        assert_eq!(store_of("s3://127.0.0.1:9000/train"), Some(("127.0.0.1:9000", "train")));
        assert_eq!(store_of("259:0"), None);
    }
}
