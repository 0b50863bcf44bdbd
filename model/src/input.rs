//! What the model reads from a trace: its file, proc, ipc and object rows and its block
//! layer summed per process and second, and those rows indexed by process.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;

use arrow_array::{Array, Int64Array, StringArray};
use arrow_schema::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use trainio_schema::{keys, read_metadata, read_rows, segment_paths, Layer, OwnedRow};

/// What the model reads from a trace.
#[derive(Default)]
pub struct Input {
    pub file: Vec<OwnedRow>,
    pub proc_rows: Vec<OwnedRow>,
    pub ipc: Vec<OwnedRow>,
    /// Object requests (schema 1.8): the GETs among them are data reads (object_reads.rs).
    pub object: Vec<OwnedRow>,
    /// Block-layer bytes read, by the pid in whose context each request was issued and
    /// the second (issue_ns / 1e9) it was issued in.
    pub block_reads: HashMap<(u32, i64), u64>,
    /// The same per device (`MAJ:MIN` of the disk).
    pub block_dev_reads: HashMap<String, HashMap<(u32, i64), u64>>,
    pub has_block: bool,
}

impl Input {
    pub fn add_block_read(&mut self, pid: u32, issue_ns: i64, bytes: u64) {
        *self.block_reads.entry((pid, issue_ns.div_euclid(NS_PER_S))).or_default() += bytes;
    }
    /// A block read on `dev`, counted both per pid and second and per device.
    pub fn add_block_dev_read(&mut self, dev: Option<&str>, pid: u32, issue_ns: i64, bytes: u64) {
        self.add_block_read(pid, issue_ns, bytes);
        let Some(dev) = dev else { return };
        let per_pid = match self.block_dev_reads.get_mut(dev) {
            Some(m) => m,
            None => self.block_dev_reads.entry(dev.to_string()).or_default(),
        };
        *per_pid.entry((pid, issue_ns.div_euclid(NS_PER_S))).or_default() += bytes;
    }
}

pub(crate) const NS_PER_S: i64 = 1_000_000_000;

/// Reads what the model needs from a trace: its file, proc, ipc and object rows, and the block
/// layer summed per process (streamed: a block layer of 100 M rows is never held).
pub fn load_input(trace: &Path) -> Result<Input, String> {
    let mut input = Input::default();
    let segs = segment_paths(trace).map_err(|e| e.to_string())?;
    let total: u64 = segs.iter().filter_map(|p| p.metadata().ok()).map(|m| m.len()).sum();
    if total < (256 << 20) {
        for r in read_rows(trace, None).map_err(|e| e.to_string())? {
            match r.layer {
                Layer::File => input.file.push(r),
                Layer::Proc => input.proc_rows.push(r),
                Layer::Ipc => input.ipc.push(r),
                Layer::Block => {
                    input.has_block = true;
                    if &*r.op == "read" {
                        input.add_block_dev_read(r.dev.as_deref(), r.pid, r.issue_ns, r.bytes.max(0) as u64);
                    }
                }
                Layer::Object => input.object.push(r),
                Layer::Nfs => {}
            }
        }
        return Ok(input);
    }
    // A trace that says it did not record the object layer has no object rows to scan for.
    let layers = read_metadata(trace).ok().and_then(|m| m.get(keys::LAYERS).cloned());
    let has_object = layers.is_none_or(|l| l.contains("\"object\""));
    for layer in [Layer::File, Layer::Proc, Layer::Ipc, Layer::Object] {
        if layer == Layer::Object && !has_object {
            continue;
        }
        let rows = read_rows(trace, Some(layer)).map_err(|e| e.to_string())?;
        match layer {
            Layer::File => input.file = rows,
            Layer::Proc => input.proc_rows = rows,
            Layer::Ipc => input.ipc = rows,
            _ => input.object = rows,
        }
    }
    for seg in &segs {
        block_sums(seg, &mut input)?;
    }
    Ok(input)
}

/// Block-layer read bytes per pid of one segment, reading only the columns needed.
fn block_sums(seg: &Path, input: &mut Input) -> Result<(), String> {
    let f = File::open(seg).map_err(|e| format!("{}: cannot open: {e}", seg.display()))?;
    let b = ParquetRecordBatchReaderBuilder::try_new(f).map_err(|e| format!("{}: not Parquet: {e}", seg.display()))?;
    let schema = b.parquet_schema();
    let want = ["layer", "op", "pid", "bytes", "issue_ns", "dev"];
    let idx: Vec<usize> = (0..schema.num_columns()).filter(|&i| want.contains(&schema.column(i).name())).collect();
    let mask = ProjectionMask::leaves(schema, idx);
    let reader =
        b.with_projection(mask).with_batch_size(65536).build().map_err(|e| format!("{}: {e}", seg.display()))?;
    for batch in reader {
        let batch = batch.map_err(|e| format!("{}: corrupt: {e}", seg.display()))?;
        let col = |n: &str, t: &DataType| {
            batch
                .column_by_name(n)
                .ok_or_else(|| format!("{}: missing column `{n}`", seg.display()))
                .and_then(|c| arrow_cast::cast(c, t).map_err(|e| format!("{}: column `{n}`: {e}", seg.display())))
        };
        let layer = col("layer", &DataType::Utf8)?;
        let op = col("op", &DataType::Utf8)?;
        let pid = col("pid", &DataType::Int64)?;
        let bytes = col("bytes", &DataType::Int64)?;
        let issue = col("issue_ns", &DataType::Int64)?;
        let issue = issue.as_any().downcast_ref::<Int64Array>().unwrap();
        let dev = col("dev", &DataType::Utf8)?;
        let dev = dev.as_any().downcast_ref::<StringArray>().unwrap();
        let layer = layer.as_any().downcast_ref::<StringArray>().unwrap();
        let op = op.as_any().downcast_ref::<StringArray>().unwrap();
        let pid = pid.as_any().downcast_ref::<Int64Array>().unwrap();
        let bytes = bytes.as_any().downcast_ref::<Int64Array>().unwrap();
        for i in 0..batch.num_rows() {
            if layer.is_null(i) || layer.value(i) != "block" {
                continue;
            }
            input.has_block = true;
            if !op.is_null(i) && op.value(i) == "read" {
                let d = (!dev.is_null(i)).then(|| dev.value(i));
                input.add_block_dev_read(d, pid.value(i) as u32, issue.value(i), bytes.value(i).max(0) as u64);
            }
        }
    }
    Ok(())
}

pub(crate) fn is_data_read(r: &OwnedRow) -> bool {
    &*r.op == "read" && r.error == 0 && r.bytes > 0 && r.offset.is_some()
}

/// The rows of each process, indexed once: a GPU's inference and its coverage read only
/// their own processes' rows, not the whole trace per GPU and per worker.
pub(crate) struct ByPid<'a> {
    pub(crate) file: HashMap<u32, Vec<&'a OwnedRow>>,
    pub(crate) ipc: HashMap<u32, Vec<&'a OwnedRow>>,
    /// Data reads (`is_data_read`, on the data device).
    pub(crate) data: HashMap<u32, Vec<&'a OwnedRow>>,
    /// Block read bytes by second.
    pub(crate) block: HashMap<u32, Vec<(i64, u64)>>,
}

impl<'a> ByPid<'a> {
    pub(crate) fn new(input: &'a Input, data_reads: &[&'a OwnedRow], block_reads: &HashMap<(u32, i64), u64>) -> Self {
        let group = |rows: &mut dyn Iterator<Item = &'a OwnedRow>| {
            let mut m: HashMap<u32, Vec<&'a OwnedRow>> = HashMap::new();
            for r in rows {
                m.entry(r.pid).or_default().push(r);
            }
            m
        };
        let mut block: HashMap<u32, Vec<(i64, u64)>> = HashMap::new();
        for (&(pid, sec), &b) in block_reads {
            block.entry(pid).or_default().push((sec, b));
        }
        ByPid {
            file: group(&mut input.file.iter()),
            ipc: group(&mut input.ipc.iter()),
            data: group(&mut data_reads.iter().copied()),
            block,
        }
    }
}

/// The rows of `pid` in one of ByPid's maps.
pub(crate) fn rows_of<'m, 'a>(m: &'m HashMap<u32, Vec<&'a OwnedRow>>, pid: u32) -> &'m [&'a OwnedRow] {
    m.get(&pid).map(Vec::as_slice).unwrap_or(&[])
}
