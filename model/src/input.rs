//! What the model reads from a trace: its file, proc, ipc and object rows, its block
//! layer summed per process and second and its block reads' arrivals (arrivals.rs), and
//! those rows indexed by process.

use std::collections::HashMap;
use std::path::Path;

use arrow_array::RecordBatch;
use trainio_schema::{read_batches, BatchOrigin, Layer, OpenMember, OwnedRow, RowDecoder, TraceError};

use crate::arrivals::Arrivals;

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
    /// When each process's block reads reached the device.
    pub arrivals: Arrivals,
}

impl Input {
    pub fn add_block_read(&mut self, pid: u32, issue_ns: i64, bytes: u64) {
        *self.block_reads.entry((pid, issue_ns.div_euclid(NS_PER_S))).or_default() += bytes;
    }
    /// A block read on `dev`, counted both per pid and second and per device.
    pub fn add_block_dev_read(&mut self, dev: Option<&str>, pid: u32, issue_ns: i64, bytes: u64) {
        let sec = issue_ns.div_euclid(NS_PER_S);
        add_block_read(&mut self.block_reads, &mut self.block_dev_reads, dev, pid, sec, bytes as i64);
    }
}

/// [`Input::add_block_dev_read`] on the two maps it adds to (`bytes` below 0 counted as 0).
fn add_block_read(
    all: &mut HashMap<(u32, i64), u64>,
    by_dev: &mut HashMap<String, HashMap<(u32, i64), u64>>,
    dev: Option<&str>,
    pid: u32,
    sec: i64,
    bytes: i64,
) {
    let bytes = bytes.max(0) as u64;
    *all.entry((pid, sec)).or_default() += bytes;
    let Some(dev) = dev else { return };
    let per_pid = match by_dev.get_mut(dev) {
        Some(m) => m,
        None => by_dev.entry(dev.to_string()).or_default(),
    };
    *per_pid.entry((pid, sec)).or_default() += bytes;
}

pub(crate) const NS_PER_S: i64 = 1_000_000_000;

/// Builds the model's [`Input`] from a trace's batches, one at a time: the file, proc, ipc
/// and object rows kept, the block layer summed (a block layer of 100 M rows is never
/// held). Fed by [`load_input`] from the trace's files, or by the analyzer with the
/// batches it decoded.
#[derive(Default)]
pub struct InputBuilder {
    input: Input,
    rows: RowDecoder,
}

impl InputBuilder {
    /// Adds the rows of one batch (checked as [`RowDecoder::decode`] says).
    pub fn push(&mut self, batch: &RecordBatch, origin: &BatchOrigin) -> Result<(), TraceError> {
        let input = &mut self.input;
        self.rows.decode(
            batch,
            origin,
            |l| !matches!(l, Layer::Block | Layer::Nfs),
            |r| match r.layer {
                Layer::File => input.file.push(r),
                Layer::Proc => input.proc_rows.push(r),
                Layer::Ipc => input.ipc.push(r),
                _ => input.object.push(r),
            },
            |r| {
                if r.layer == Layer::Block {
                    input.has_block = true;
                    if r.op == "read" {
                        let (pid, sec) = (r.pid, r.issue_ns.div_euclid(NS_PER_S));
                        add_block_read(&mut input.block_reads, &mut input.block_dev_reads, r.dev, pid, sec, r.bytes);
                        input.arrivals.add(pid, r.insert_ns.unwrap_or(r.issue_ns));
                    }
                }
            },
        )
    }

    pub fn finish(mut self) -> Input {
        self.input.arrivals.finish();
        self.input
    }
}

/// Reads what the model needs from a trace's files (see [`InputBuilder`]).
pub fn load_input(trace: &Path) -> Result<Input, String> {
    let mut b = InputBuilder::default();
    read_batches(trace, |batch, origin| b.push(batch, origin)).map_err(|e| e.to_string())?;
    Ok(b.finish())
}

/// [`load_input`] of a trace set's member, opened when the set was read (its last
/// segment is not opened again).
pub fn load_member_input(member: OpenMember) -> Result<Input, String> {
    let mut b = InputBuilder::default();
    member.read_batches(|batch, origin| b.push(batch, origin)).map_err(|e| e.to_string())?;
    Ok(b.finish())
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
