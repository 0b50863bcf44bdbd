//! Rows → Arrow batches: the tracer's rows are appended to per-column builders (a
//! dictionary column compares with the previous row's value before it hashes, an integer
//! column keeps runs of equal values) and finished into a RecordBatch of the trace's
//! schema, which write.rs turns into segments.
use std::sync::Arc;

use arrow_array::builder::{Int64Builder, PrimitiveBuilder, UInt32Builder};
use arrow_array::types::{
    ArrowDictionaryKeyType, ArrowPrimitiveType, Int16Type, Int32Type, Int64Type, Int8Type, UInt32Type,
};
use arrow_array::{ArrayRef, DictionaryArray, RecordBatch, StringArray};
use arrow_schema::ArrowError;
use arrow_schema::SchemaRef;
use rustc_hash::FxHashMap;

use crate::{arrow_schema, ObjectFields, Row, Rpc};

/// A dictionary-encoded string column. The tracer appends the same few strings (layer,
/// op, device, command) to every row, so the previous row's value is compared first and
/// only a change pays for a hash lookup; this halved the tracer's CPU per event compared
/// with Arrow's generic dictionary builder.
struct DictColumn<K: ArrowDictionaryKeyType> {
    keys: Runs<K>,
    values: Vec<Box<str>>,
    index: FxHashMap<Box<str>, usize>,
    last: Option<usize>,
    /// The caller's key for `last` (append_keyed): a match skips comparing strings.
    last_key: Option<u128>,
}

impl<K: ArrowDictionaryKeyType> DictColumn<K> {
    fn new() -> Self {
        DictColumn {
            keys: Runs::with_capacity(0),
            values: Vec::new(),
            index: FxHashMap::default(),
            last: None,
            last_key: None,
        }
    }

    /// Appends `v`, known to the caller by `key` (equal keys: equal strings), so that a
    /// run of one value costs a key comparison per row.
    fn append_keyed(&mut self, key: u128, v: &str) -> Result<(), ArrowError> {
        match self.last {
            Some(i) if self.last_key == Some(key) => self.push_key(i),
            _ => {
                self.append(v)?;
                self.last_key = Some(key);
                Ok(())
            }
        }
    }

    fn push_key(&mut self, i: usize) -> Result<(), ArrowError> {
        let key = <K::Native as arrow_buffer::ArrowNativeType>::from_usize(i)
            .ok_or_else(|| ArrowError::DictionaryKeyOverflowError)?;
        self.keys.push_value(key);
        Ok(())
    }

    fn append(&mut self, v: &str) -> Result<(), ArrowError> {
        self.last_key = None;
        let i = match self.last {
            // Static and interned strings compare by address; the rest by content.
            Some(i) if std::ptr::eq(self.values[i].as_ptr(), v.as_ptr()) && self.values[i].len() == v.len() => i,
            Some(i) if &*self.values[i] == v => i,
            _ => {
                let i = match self.index.get(v) {
                    Some(&i) => i,
                    None => {
                        let i = self.values.len();
                        self.values.push(v.into());
                        self.index.insert(v.into(), i);
                        i
                    }
                };
                self.last = Some(i);
                i
            }
        };
        self.push_key(i)
    }

    fn append_null(&mut self) {
        self.keys.push(None);
    }

    /// Sizes the (empty) column for `rows` rows.
    fn reserve(&mut self, rows: usize) {
        self.keys = Runs::with_capacity(rows);
    }

    /// The column so far; starts empty again (each batch carries its own dictionary).
    fn finish(&mut self) -> DictionaryArray<K> {
        let keys = self.keys.finish();
        let values = StringArray::from_iter_values(self.values.drain(..));
        self.index.clear();
        self.last = None;
        self.last_key = None;
        DictionaryArray::try_new(keys, Arc::new(values)).expect("keys index the values")
    }
}

/// An integer column appended in runs: a row equal to the one before it (value, or null)
/// only lengthens the current run, and each run is written to the builder in one call
/// when it ends. Block rows repeat most columns row after row (pid, tid, bytes, flags,
/// error; null file, fd and RPC columns), so this is a comparison per row rather than a
/// store into each column's buffer and validity bitmap.
struct Runs<T: ArrowPrimitiveType> {
    values: PrimitiveBuilder<T>,
    /// The current run's value (None: null) and length (0: no run yet).
    run: Option<T::Native>,
    len: usize,
}

impl<T: ArrowPrimitiveType> Runs<T> {
    fn with_capacity(rows: usize) -> Self {
        Runs { values: PrimitiveBuilder::with_capacity(rows), run: None, len: 0 }
    }

    #[inline]
    fn push(&mut self, v: Option<T::Native>) {
        if self.run == v {
            self.len += 1;
        } else {
            self.end_run();
            self.run = v;
            self.len = 1;
        }
    }

    #[inline]
    fn push_value(&mut self, v: T::Native) {
        self.push(Some(v))
    }

    fn end_run(&mut self) {
        match self.run {
            Some(v) => self.values.append_value_n(v, self.len),
            None => self.values.append_nulls(self.len),
        }
        self.len = 0;
    }

    fn finish(&mut self) -> arrow_array::PrimitiveArray<T> {
        self.end_run();
        self.run = None;
        self.values.finish()
    }
}

/// What the caller knows a row's strings by (BatchBuilder::push_keyed): equal keys in one
/// column mean equal strings.
#[derive(Clone, Copy, Debug)]
pub struct RowKeys {
    pub op: u32,
    pub dev: u32,
    pub comm: u128,
}

/// Accumulates rows column by column.
pub struct BatchBuilder {
    schema: SchemaRef,
    layer: DictColumn<Int8Type>,
    op: DictColumn<Int8Type>,
    issue_ns: Int64Builder,
    complete_ns: Int64Builder,
    insert_ns: Runs<Int64Type>,
    dev: DictColumn<Int16Type>,
    offset: Int64Builder,
    bytes: Runs<Int64Type>,
    bytes_requested: Runs<Int64Type>,
    queue_depth: UInt32Builder,
    pid: Runs<UInt32Type>,
    tid: Runs<UInt32Type>,
    comm: DictColumn<Int32Type>,
    fd: Runs<Int32Type>,
    file: DictColumn<Int32Type>,
    error: Runs<Int32Type>,
    flags: Runs<UInt32Type>,
    rpc_xid: Runs<UInt32Type>,
    rpc_backlog_ns: Runs<Int64Type>,
    rpc_rtt_ns: Runs<Int64Type>,
    rpc_execute_ns: Runs<Int64Type>,
    rpc_retrans: Runs<UInt32Type>,
    ppid: Runs<UInt32Type>,
    endpoint: DictColumn<Int16Type>,
    http_status: Runs<UInt32Type>,
    first_byte_ns: Runs<Int64Type>,
    len: usize,
    /// Rows each column is sized for after every finish (0: grow as needed).
    capacity: usize,
}

impl Default for BatchBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl BatchBuilder {
    pub fn new() -> Self {
        BatchBuilder {
            schema: arrow_schema(),
            layer: DictColumn::new(),
            op: DictColumn::new(),
            issue_ns: Int64Builder::new(),
            complete_ns: Int64Builder::new(),
            insert_ns: Runs::with_capacity(0),
            dev: DictColumn::new(),
            offset: Int64Builder::new(),
            bytes: Runs::with_capacity(0),
            bytes_requested: Runs::with_capacity(0),
            queue_depth: UInt32Builder::new(),
            pid: Runs::with_capacity(0),
            tid: Runs::with_capacity(0),
            comm: DictColumn::new(),
            fd: Runs::with_capacity(0),
            file: DictColumn::new(),
            error: Runs::with_capacity(0),
            flags: Runs::with_capacity(0),
            rpc_xid: Runs::with_capacity(0),
            rpc_backlog_ns: Runs::with_capacity(0),
            rpc_rtt_ns: Runs::with_capacity(0),
            rpc_execute_ns: Runs::with_capacity(0),
            rpc_retrans: Runs::with_capacity(0),
            ppid: Runs::with_capacity(0),
            endpoint: DictColumn::new(),
            http_status: Runs::with_capacity(0),
            first_byte_ns: Runs::with_capacity(0),
            len: 0,
            capacity: 0,
        }
    }

    /// A builder whose columns hold `rows` rows without reallocating, again after every
    /// [`finish`](Self::finish) (the tracer's drain path: no copying as columns grow).
    pub fn with_capacity(rows: usize) -> Self {
        let mut b = Self::new();
        b.capacity = rows;
        b.reserve(rows);
        b
    }

    /// Sizes every (empty) column for `rows` rows.
    fn reserve(&mut self, rows: usize) {
        self.layer.reserve(rows);
        self.op.reserve(rows);
        self.dev.reserve(rows);
        self.comm.reserve(rows);
        self.file.reserve(rows);
        self.issue_ns = Int64Builder::with_capacity(rows);
        self.complete_ns = Int64Builder::with_capacity(rows);
        self.insert_ns = Runs::with_capacity(rows);
        self.offset = Int64Builder::with_capacity(rows);
        self.bytes = Runs::with_capacity(rows);
        self.bytes_requested = Runs::with_capacity(rows);
        self.queue_depth = UInt32Builder::with_capacity(rows);
        self.pid = Runs::with_capacity(rows);
        self.tid = Runs::with_capacity(rows);
        self.fd = Runs::with_capacity(rows);
        self.error = Runs::with_capacity(rows);
        self.flags = Runs::with_capacity(rows);
        self.rpc_xid = Runs::with_capacity(rows);
        self.rpc_backlog_ns = Runs::with_capacity(rows);
        self.rpc_rtt_ns = Runs::with_capacity(rows);
        self.rpc_execute_ns = Runs::with_capacity(rows);
        self.rpc_retrans = Runs::with_capacity(rows);
        self.ppid = Runs::with_capacity(rows);
        self.endpoint.reserve(rows);
        self.http_status = Runs::with_capacity(rows);
        self.first_byte_ns = Runs::with_capacity(rows);
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A row without RPC fields (every layer but nfs, and nfs rows not joined).
    pub fn push(&mut self, r: &Row) {
        self.push_rpc(r, None)
    }

    /// A row whose device and command the caller knows by number (the kernel's dev_t and
    /// the raw 16-byte comm): runs of one device or command skip the string comparison.
    pub fn push_keyed(&mut self, r: &Row, keys: RowKeys) {
        self.push_with(r, None, Some(keys))
    }

    /// A row with the RPC that carried it (nfs layer).
    pub fn push_rpc(&mut self, r: &Row, rpc: Option<&Rpc>) {
        self.push_with(r, rpc, None)
    }

    /// An object-layer row (schema 1.8) with its endpoint, status and first byte.
    pub fn push_object(&mut self, r: &Row, o: &ObjectFields<&str>) {
        self.push_inner(r, None, None, Some(o))
    }

    #[inline]
    fn push_with(&mut self, r: &Row, rpc: Option<&Rpc>, keys: Option<RowKeys>) {
        self.push_inner(r, rpc, keys, None)
    }

    #[inline]
    fn push_inner(&mut self, r: &Row, rpc: Option<&Rpc>, keys: Option<RowKeys>, object: Option<&ObjectFields<&str>>) {
        // Dictionary keys overflow only past 127 ops/layers or 32767 devices per batch.
        self.layer.append_keyed(r.layer as u128, r.layer.as_str()).expect("layer dictionary");
        match keys {
            Some(k) => self.op.append_keyed(k.op.into(), r.op),
            None => self.op.append(r.op),
        }
        .expect("op dictionary");
        self.issue_ns.append_value(r.issue_ns);
        self.complete_ns.append_value(r.complete_ns);
        self.insert_ns.push(r.insert_ns);
        match (r.dev, keys) {
            (Some(d), Some(k)) => self.dev.append_keyed(k.dev.into(), d).expect("dev dictionary"),
            (Some(d), None) => self.dev.append(d).expect("dev dictionary"),
            (None, _) => self.dev.append_null(),
        }
        self.offset.append_option(r.offset);
        self.bytes.push_value(r.bytes);
        self.bytes_requested.push_value(r.bytes_requested);
        self.queue_depth.append_value(r.queue_depth);
        self.pid.push_value(r.pid);
        self.tid.push_value(r.tid);
        match keys {
            Some(k) => self.comm.append_keyed(k.comm, r.comm),
            None => self.comm.append(r.comm),
        }
        .expect("comm dictionary");
        self.fd.push(r.fd);
        match r.file {
            Some(f) => self.file.append(f).expect("file dictionary"),
            None => self.file.append_null(),
        }
        self.error.push_value(r.error);
        self.flags.push_value(r.flags);
        self.rpc_xid.push(rpc.map(|p| p.xid));
        self.rpc_backlog_ns.push(rpc.map(|p| p.backlog_ns));
        self.rpc_rtt_ns.push(rpc.map(|p| p.rtt_ns));
        self.rpc_execute_ns.push(rpc.map(|p| p.execute_ns));
        self.rpc_retrans.push(rpc.and_then(|p| p.retrans));
        self.ppid.push(r.ppid);
        match object {
            Some(o) => self.endpoint.append(o.endpoint).expect("endpoint dictionary"),
            None => self.endpoint.append_null(),
        }
        self.http_status.push(object.and_then(|o| o.http_status));
        self.first_byte_ns.push(object.and_then(|o| o.first_byte_ns));
        self.len += 1;
    }

    /// Takes the rows pushed so far as one batch and starts empty again.
    pub fn finish(&mut self) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.layer.finish()),
            Arc::new(self.op.finish()),
            Arc::new(self.issue_ns.finish()),
            Arc::new(self.complete_ns.finish()),
            Arc::new(self.insert_ns.finish()),
            Arc::new(self.dev.finish()),
            Arc::new(self.offset.finish()),
            Arc::new(self.bytes.finish()),
            Arc::new(self.bytes_requested.finish()),
            Arc::new(self.queue_depth.finish()),
            Arc::new(self.pid.finish()),
            Arc::new(self.tid.finish()),
            Arc::new(self.comm.finish()),
            Arc::new(self.fd.finish()),
            Arc::new(self.file.finish()),
            Arc::new(self.error.finish()),
            Arc::new(self.flags.finish()),
            Arc::new(self.rpc_xid.finish()),
            Arc::new(self.rpc_backlog_ns.finish()),
            Arc::new(self.rpc_rtt_ns.finish()),
            Arc::new(self.rpc_execute_ns.finish()),
            Arc::new(self.rpc_retrans.finish()),
            Arc::new(self.ppid.finish()),
            Arc::new(self.endpoint.finish()),
            Arc::new(self.http_status.finish()),
            Arc::new(self.first_byte_ns.finish()),
        ];
        self.len = 0;
        if self.capacity > 0 {
            self.reserve(self.capacity);
        }
        RecordBatch::try_new(self.schema.clone(), columns).expect("batch matches schema")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::Array;

    fn strings(a: &ArrayRef) -> Vec<Option<String>> {
        let d = a.as_any_dictionary();
        let values = d.values().as_string::<i32>();
        let keys = arrow_cast::cast(d.keys(), &arrow_schema::DataType::Int64).unwrap();
        let keys = keys.as_primitive::<arrow_array::types::Int64Type>();
        (0..a.len()).map(|i| keys.is_valid(i).then(|| values.value(keys.value(i) as usize).to_string())).collect()
    }

    #[test]
    fn dictionary_columns_keep_every_value_across_batches() {
        let mut b = BatchBuilder::new();
        let comms = ["fio", "fio", "kworker/0:1", "fio", "dd", "kworker/0:1"];
        let devs = [Some("7:0"), Some("7:0"), None, Some("259:1"), Some("7:0"), None];
        for round in 0..2 {
            for (i, (c, d)) in comms.iter().zip(devs).enumerate() {
                b.push(&Row {
                    layer: if i % 2 == 0 { crate::Layer::Block } else { crate::Layer::File },
                    op: if i == 4 { "write" } else { "read" },
                    issue_ns: i as i64,
                    complete_ns: i as i64 + 1,
                    dev: d,
                    comm: c,
                    file: (round == 1).then_some("/data/x"),
                    ..Row::sample()
                });
            }
            // Each batch carries its own, complete dictionary.
            let batch = b.finish();
            let col = |n: &str| strings(batch.column_by_name(n).unwrap());
            assert_eq!(col("comm"), comms.iter().map(|c| Some(c.to_string())).collect::<Vec<_>>());
            assert_eq!(col("dev"), devs.iter().map(|d| d.map(str::to_string)).collect::<Vec<_>>());
            assert_eq!(col("layer")[..3], [Some("block".into()), Some("file".into()), Some("block".into())]);
            assert_eq!(col("op")[4], Some("write".into()));
            assert_eq!(col("op")[5], Some("read".into()));
            let want_file = (round == 1).then(|| "/data/x".to_string());
            assert!(col("file").iter().all(|f| *f == want_file));
            let comm_dict = batch.column_by_name("comm").unwrap().as_any_dictionary().values().len();
            assert_eq!(comm_dict, 3, "one dictionary entry per distinct value");
        }
    }

    fn row<'a>(comm: &'a str, dev: Option<&'a str>, insert_ns: Option<i64>, fd: Option<i32>) -> Row<'a> {
        Row { comm, dev, insert_ns, fd, ..Row::sample() }
    }

    #[test]
    fn runs_read_back_as_pushed() {
        // Runs of values and of nulls, single rows between them, a run longer than the
        // capacity, and a batch that ends inside a run: the next batch starts afresh.
        let mut seq: Vec<Option<i64>> = vec![Some(4096); 40];
        seq.extend([None, Some(1), Some(1), None, None, Some(0), Some(2), Some(1)]);
        seq.extend(std::iter::repeat_n(None, 30));
        seq.extend((0..20).map(|i| Some(i / 3)));
        let mut c = Runs::<arrow_array::types::Int64Type>::with_capacity(16);
        for cut in [seq.len(), 45, 1] {
            let (first, second) = seq.split_at(cut);
            for part in [first, second] {
                for &v in part {
                    c.push(v);
                }
                let a = c.finish();
                assert_eq!(a.iter().collect::<Vec<_>>(), part, "batch of {} rows cut at {cut}", part.len());
                assert_eq!(a.null_count(), part.iter().filter(|v| v.is_none()).count());
            }
        }
    }

    #[test]
    fn keyed_rows_and_bulk_nulls_read_back_as_pushed() {
        let mut b = BatchBuilder::with_capacity(16);
        let keys = |comm: u128| RowKeys { op: 0, dev: 7, comm };
        // (comm, its key or None for an unkeyed push, insert_ns, fd)
        #[allow(clippy::type_complexity)]
        let rows: [(&str, Option<u128>, Option<i64>, Option<i32>); 7] = [
            ("fio", Some(1), None, None),
            ("fio", Some(1), Some(5), None),
            ("dd", None, None, Some(3)), // an unkeyed push between two keyed ones
            ("fio", Some(1), None, None),
            ("kworker", Some(2), None, None),
            ("kworker", Some(2), Some(9), Some(4)),
            ("fio", Some(1), None, None),
        ];
        for round in 0..2 {
            for (comm, key, ins, fd) in rows {
                let r = row(comm, Some("7:0"), ins, fd);
                match key {
                    Some(k) => b.push_keyed(&r, keys(k)),
                    None => b.push(&r),
                }
            }
            // A new batch starts a new dictionary: the first keyed row must not reuse a
            // key of the last batch's dictionary.
            let batch = b.finish();
            let col = |n: &str| strings(batch.column_by_name(n).unwrap());
            assert_eq!(col("comm"), rows.iter().map(|r| Some(r.0.to_string())).collect::<Vec<_>>(), "round {round}");
            assert!(col("dev").iter().all(|d| d.as_deref() == Some("7:0")));
            let ins = batch.column_by_name("insert_ns").unwrap().as_primitive::<arrow_array::types::Int64Type>();
            assert_eq!(ins.iter().collect::<Vec<_>>(), rows.iter().map(|r| r.2).collect::<Vec<_>>());
            let fd = batch.column_by_name("fd").unwrap().as_primitive::<arrow_array::types::Int32Type>();
            assert_eq!(fd.iter().collect::<Vec<_>>(), rows.iter().map(|r| r.3).collect::<Vec<_>>());
            let xid = batch.column_by_name("rpc_xid").unwrap();
            assert_eq!((xid.len(), xid.null_count()), (7, 7));
        }
    }
}
