//! Workload mode: what each simulated GPU reads, derived from a DLIO workload and the
//! dataset layout. GPU g of N reads its own shard (every N-th file), `batch_size` samples
//! per step, in file order unless the workload asks for shuffling.
//!
//! How a sample is read follows the format's real reader (formats.rs, docs/design/formats.md): npz and npy as numpy.load reads them, the file opened and closed per
//! sample as DLIO's on-demand readers do; hdf5 as h5py opens the file and reads the
//! sample's row (hdf5.rs), the file opened and closed per sample too; TFRecord files streamed by TensorFlow's
//! parallel interleave (`read_threads` files at once, each read in buffer-sized preads);
//! indexed_binary as DLIO's reader reads it (the index files once per reader, then one
//! read per sample) and mmap_indexed_binary through mappings of the files (indexed.rs);
//! other formats, and every format under O_DIRECT, the sample's bytes in
//! `transfer_size` requests.

use crate::dataset::Layout;
use crate::engine::{Batch, Program, SampleRead};
use crate::formats::indexed;
use crate::formats::{self, Format, Req};
use crate::workload::{ComputeTime, Shuffle, Workload};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use std::cell::RefCell;
use std::path::PathBuf;

/// (epoch, sample order of that epoch).
type EpochOrder = (u64, Vec<u32>);
/// (epoch, that epoch's batches).
type EpochBatches = (u64, Vec<Batch>);

pub struct WorkloadProgram {
    pub layout: Layout,
    pub batch_size: u64,
    pub read_threads: usize,
    pub prefetch_size: usize,
    pub transfer_size: u64,
    pub compute: ComputeTime,
    /// DLIO's `preprocess_time` (mean, stdev; seconds): slept by the worker after each
    /// sample it reads.
    preprocess: (f64, f64),
    pub epochs: u64,
    pub steps_per_epoch: u64,
    file_shuffle: Shuffle,
    sample_shuffle: Shuffle,
    seed: u64,
    /// Per local GPU: its global index and the files of its shard.
    shards: Vec<(u64, Vec<usize>)>,
    /// Per local GPU: (epoch, sample order) so a shuffled order is computed once per epoch.
    orders: RefCell<Vec<Option<EpochOrder>>>,
    format: Format,
    odirect: bool,
    /// The data files' st_blksize: the buffer of Python's and glibc's buffered readers.
    blksize: u64,
    /// TFRecord: TensorFlow's reader buffer (DLIO passes reader.transfer_size; TF's
    /// default is 256 KiB).
    tf_buffer: u64,
    /// TFRecord: per local GPU, (epoch, that epoch's batches) of the interleave.
    streamed: RefCell<Vec<Option<EpochBatches>>>,
    /// DLIO's loader: how many readers load the index files of an indexed format.
    loader: String,
    /// mmap_indexed_binary: the mappings of the files read so far, by file.
    mapped: RefCell<std::collections::HashMap<usize, crate::formats::indexed::Mapped>>,
    /// Parquet: per local GPU, per worker, what its reader holds.
    parquet_readers: RefCell<Vec<Vec<ParquetReader>>>,
}

/// What one worker's DLIO parquet reader holds in an epoch: the files whose footer it
/// read (it keeps them open), and the row groups it keeps (least recently used first).
#[derive(Default, Clone)]
struct ParquetReader {
    epoch: u64,
    opened: std::collections::HashSet<usize>,
    cached: std::collections::VecDeque<(usize, usize)>,
}

/// TensorFlow's reader buffer when the workload sets no transfer_size.
pub const TF_BUFFER: u64 = 256 << 10;

impl WorkloadProgram {
    /// `max_steps` caps the steps per epoch (0 = no cap); `tf_buffer` is TensorFlow's
    /// reader buffer for TFRecord files.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        workload: &Workload,
        layout: Layout,
        total_gpus: u64,
        local: &[u64],
        transfer_size: u64,
        max_steps: u64,
        odirect: bool,
        tf_buffer: u64,
    ) -> WorkloadProgram {
        use std::os::unix::fs::MetadataExt;
        let blksize = layout
            .files
            .first()
            .and_then(|f| std::fs::metadata(layout.root.join(&f.rel)).ok())
            .map(|m| m.blksize())
            .filter(|&b| b > 1)
            .unwrap_or(4096);
        let shards: Vec<(u64, Vec<usize>)> = local.iter().map(|&g| (g, layout.shard(g, total_gpus))).collect();
        let files_per_gpu = layout.files.len() as u64 / total_gpus;
        let mut steps = files_per_gpu * layout.samples_per_file / workload.batch_size;
        if max_steps > 0 {
            steps = steps.min(max_steps);
        }
        let n = shards.len();
        let layout_format = layout.format;
        WorkloadProgram {
            layout,
            batch_size: workload.batch_size,
            read_threads: workload.read_threads as usize,
            prefetch_size: workload.prefetch_size as usize,
            transfer_size,
            compute: workload.computation_time.clone(),
            preprocess: (workload.preprocess_time, workload.preprocess_time_stdev),
            epochs: workload.epochs,
            steps_per_epoch: steps,
            file_shuffle: workload.file_shuffle,
            sample_shuffle: workload.sample_shuffle,
            seed: workload.seed,
            shards,
            orders: RefCell::new(vec![None; n]),
            format: layout_format,
            odirect,
            blksize,
            tf_buffer: tf_buffer.max(1),
            streamed: RefCell::new(vec![None; n]),
            loader: workload.data_loader.to_ascii_lowercase(),
            mapped: RefCell::new(std::collections::HashMap::new()),
            parquet_readers: RefCell::new(vec![
                vec![ParquetReader::default(); workload.read_threads.max(1) as usize];
                n
            ]),
        }
    }

    /// The reads of GPU `gpu`'s batch `step` of `epoch`, by the format's reader.
    fn batch_reads(&self, gpu: usize, epoch: u64, step: u64) -> Batch {
        if self.format == Format::TfRecord {
            let mut streamed = self.streamed.borrow_mut();
            if streamed[gpu].as_ref().map(|(e, _)| *e) != Some(epoch) {
                streamed[gpu] = Some((epoch, self.stream_batches(gpu, epoch)));
            }
            let batches = &mut streamed[gpu].as_mut().unwrap().1;
            return std::mem::take(&mut batches[step as usize]);
        }
        let mut orders = self.orders.borrow_mut();
        if orders[gpu].as_ref().map(|(e, _)| *e) != Some(epoch) {
            orders[gpu] = Some((epoch, self.sample_order(gpu, epoch)));
        }
        let order = &orders[gpu].as_ref().unwrap().1;
        let spf = self.layout.samples_per_file;
        let files = &self.shards[gpu].1;
        let from = (step * self.batch_size) as usize;
        let to = (from + self.batch_size as usize).min(order.len());
        if self.format == Format::MmapIndexedBinary && !self.odirect {
            for &k in &order[from..to] {
                self.touch_mapped(files[(k as u64 / spf) as usize], k as u64 % spf);
            }
            return Batch { samples: (to - from) as u32, reads: Vec::new(), streams: Vec::new() };
        }
        let mut reads = self.index_reads(gpu, epoch, step);
        let samples = order[from..to].iter().map(|&k| (files[(k as u64 / spf) as usize], k as u64 % spf));
        if self.format == Format::Parquet && !self.dali() {
            // PyTorch's worker step mod W reads this batch; its reader keeps files open,
            // so reads of one file one after another go on one open of it.
            let worker = (step % self.read_threads.max(1) as u64) as usize;
            let mut last = None;
            for (f, k) in samples {
                for (offset, len, advise) in self.parquet_reads(gpu, worker, epoch, f, k) {
                    let chain = last == Some(f);
                    reads.push(SampleRead { chain, advise, ..SampleRead::new(f as u32, offset, len) });
                    last = Some(f);
                }
            }
            return Batch { samples: (to - from) as u32, reads, streams: Vec::new() };
        }
        if !self.dali() {
            reads.extend(samples.flat_map(|(f, k)| self.sample_reads(f, k)));
            return Batch { samples: (to - from) as u32, reads, streams: Vec::new() };
        }
        // DALI: the GPU's process read the index files (stream 0) before its workers start.
        let mut streams = vec![0; reads.len()];
        let samples: Vec<(usize, u64)> = samples.collect();
        for (j, &(f, k)) in samples.iter().enumerate() {
            let mut sample = self.sample_reads(f, k);
            let alias = self.sample_alias(f, k);
            if let Some(last) = sample.last_mut() {
                last.close = true;
            }
            for r in &mut sample {
                r.file = alias;
            }
            streams.extend(std::iter::repeat_n(dali_worker(j, samples.len(), self.read_threads) as u32, sample.len()));
            reads.extend(sample);
        }
        Batch { samples: (to - from) as u32, reads, streams }
    }

    /// Whether the readers sleep DLIO's `preprocess_time`: set, and not TFRecord (DLIO's
    /// tf.data reader does not call `preprocess`).
    fn sleeps_preprocess(&self) -> bool {
        self.preprocess != (0.0, 0.0) && self.format != Format::TfRecord
    }

    /// DLIO's `preprocess`: after each sample's reads, the worker sleeps a normal draw
    /// of `preprocess_time` (± stdev, clamped at 0), before the sample joins its batch.
    /// A sample's first read is the one on a new open of its file (`chain` false), so the
    /// read before it ends the sample before; index files' reads and Parquet's WILLNEED
    /// hints end none. Parquet's rows share their row group's reads (or find it cached):
    /// the batch's draws are slept together after its last read, and a batch read wholly
    /// from the reader's row-group cache sleeps none (docs/replay.md, *Formats*).
    fn add_preprocess(&self, batch: &mut Batch, gpu: usize, epoch: u64, step: u64) {
        let (mean, stdev) = self.preprocess;
        let global = self.shards[gpu].0;
        let mut rng = StdRng::seed_from_u64(self.seed ^ 0x0005_eed0_fd11 ^ (epoch << 40) ^ (global << 20) ^ step);
        let normal = rand_distr::Normal::new(mean, stdev).ok();
        let mut draw = || {
            use rand_distr::Distribution;
            let t = normal.map_or(mean, |d| d.sample(&mut rng)).max(0.0);
            (t * 1e9) as u64
        };
        let n = self.layout.files.len() as u32;
        let data: Vec<usize> = (0..batch.reads.len())
            .filter(|&i| {
                let r = &batch.reads[i];
                !r.advise && (r.file < n || r.file >= 3 * n)
            })
            .collect();
        let Some(&last) = data.last() else { return };
        if self.format == Format::Parquet {
            batch.reads[last].think_ns = (0..batch.samples).map(|_| draw()).sum();
            return;
        }
        // PIL decodes as it reads (ImageFile.load feeds the decoder each 64 KiB it reads):
        // a JPEG sample's draw is spread over its reads; DLIO's other readers sleep it
        // after the sample.
        let spread = self.format == Format::Jpeg;
        let mut first = 0;
        for (j, &i) in data.iter().enumerate() {
            if data.get(j + 1).is_none_or(|&k| !batch.reads[k].chain) {
                let t = draw();
                if spread {
                    let reads = &data[first..=j];
                    for &r in reads {
                        batch.reads[r].think_ns = t / reads.len() as u64;
                    }
                } else {
                    batch.reads[i].think_ns = t;
                }
                first = j + 1;
            }
        }
    }

    /// Parquet: the reads DLIO's reader in worker `worker` of GPU `gpu` makes for row `k`
    /// of `file`: pyarrow's footer reads when the reader opens the file (once an epoch:
    /// it keeps files open), then, unless it holds the row's row group, pyarrow's reads
    /// of that row group's columns asked for (parquet_files.rs).
    /// Each request is (offset, bytes, WILLNEED hint rather than a read).
    fn parquet_reads(&self, gpu: usize, worker: usize, epoch: u64, file: usize, k: u64) -> Vec<(u64, u64, bool)> {
        let Some(layout) = &self.layout.parquet else {
            return Vec::new();
        };
        let mut readers = self.parquet_readers.borrow_mut();
        let reader = &mut readers[gpu][worker];
        if reader.epoch != epoch {
            *reader = ParquetReader { epoch, ..Default::default() };
        }
        let mut out = Vec::new();
        if reader.opened.insert(file) {
            out.extend(layout.footer_reads().into_iter().map(|(o, n)| (o, n, false)));
        }
        let rg = layout.row_group_of(k);
        if let Some(i) = reader.cached.iter().position(|&c| c == (file, rg)) {
            reader.cached.remove(i);
        } else {
            // Arrow's read cache: WILLNEED for every range, then the reads.
            let ranges = layout.row_group_reads(rg);
            out.extend(ranges.iter().map(|&(o, n)| (o, n, true)));
            out.extend(ranges.into_iter().map(|(o, n)| (o, n, false)));
            if reader.cached.len() as u64 >= layout.spec.cache {
                reader.cached.pop_front();
            }
        }
        reader.cached.push_back((file, rg));
        out
    }

    /// The order in which GPU `gpu` reads its shard's files in `epoch` (indices into the
    /// shard).
    fn file_order(&self, gpu: usize, epoch: u64) -> Vec<u32> {
        let (global, files) = &self.shards[gpu];
        let mut order: Vec<u32> = (0..files.len() as u32).collect();
        if self.file_shuffle != Shuffle::Off {
            let salt = if self.file_shuffle == Shuffle::Random { rand::random::<u64>() } else { 0 };
            order.shuffle(&mut StdRng::seed_from_u64(self.seed ^ (epoch << 32) ^ (global << 8) ^ 1 ^ salt));
        }
        order
    }

    /// What `settings.reader` says: the format, the loader, and how the replay reads
    /// them (docs/replay.md, *Formats*).
    pub fn reader_json(&self, format: &str, loader: &str) -> serde_json::Value {
        let (model, buffer) = match (self.odirect, self.format) {
            (_, Format::TfRecord) => ("tfrecord-interleave", self.tf_buffer),
            (false, Format::Npz) => ("numpy-npz", self.blksize),
            (false, Format::Npy) => ("numpy-npy", self.blksize),
            (_, Format::Hdf5(_)) => ("h5py-row", crate::formats::hdf5::SIEVE),
            (false, Format::IndexedBinary) => ("dlio-indexed-binary", self.blksize),
            (false, Format::MmapIndexedBinary) => ("dlio-mmap-indexed-binary", 0),
            (_, Format::Parquet) => ("pyarrow-row-group", crate::formats::parquet_files::FOOTER_READ),
            (false, Format::Jpeg) => ("pil-jpeg", self.blksize),
            _ => ("whole-sample", self.transfer_size),
        };
        let mut out = serde_json::json!({
            "format": format,
            "data_loader": loader,
            "model": model,
            "buffer_bytes": buffer,
        });
        if self.sleeps_preprocess() {
            let (mean, stdev) = self.preprocess;
            out["preprocess_time_s"] = serde_json::json!({"mean": mean, "stdev": stdev});
        }
        out
    }

    /// The requests that read sample `k` of `file` as the format's reader does, on one
    /// open of the file.
    fn sample_reads(&self, file: usize, k: u64) -> Vec<SampleRead> {
        let spf = self.layout.samples_per_file;
        let sample = self.layout.files[file].sample;
        let shape = formats::shape(self.format, spf, sample);
        let reqs: Vec<Req> = match (self.odirect, self.format) {
            (false, Format::Npz) => formats::npz_plan(&shape, self.blksize),
            (false, Format::Npy) => formats::npy_plan(&shape, self.blksize),
            (_, Format::Hdf5(c)) => crate::formats::hdf5::plan(spf, sample, c, k),
            (false, Format::IndexedBinary) => vec![indexed::sample_read(k, sample, self.blksize)],
            (false, Format::Jpeg) => crate::formats::jpeg::pil_plan(shape.size, self.blksize),
            // A reader of its own (DALI's workers): the footer, then the row's row group.
            (_, Format::Parquet) => match &self.layout.parquet {
                Some(p) => p.footer_reads().into_iter().chain(p.row_group_reads(p.row_group_of(k))).collect(),
                None => Vec::new(),
            },
            _ => {
                let stride = if self.format == Format::TfRecord { sample + formats::TFRECORD_FRAME } else { sample };
                let start = shape.data + k * stride;
                let step = self.transfer_size.max(1);
                (0..sample.div_ceil(step)).map(|i| (start + i * step, step.min(sample - i * step))).collect()
            }
        };
        reqs.iter()
            .enumerate()
            .map(|(i, &(offset, len))| SampleRead { chain: i > 0, ..SampleRead::new(file as u32, offset, len) })
            .collect()
    }

    /// TFRecord: the epoch's batches of GPU `gpu` as TensorFlow's parallel interleave reads
    /// them: `read_threads` slots, each streaming one file at a time (the next file of the
    /// shard goes to the slot whose file ended), records taken round-robin from the slots,
    /// `batch_size` records a batch. A read belongs to the batch of the first record that
    /// needs its bytes; the read after a file's end (which returns 0) closes it.
    fn stream_batches(&self, gpu: usize, epoch: u64) -> Vec<Batch> {
        let files = &self.shards[gpu].1;
        let spf = self.layout.samples_per_file;
        let mut queue = self.file_order(gpu, epoch).into_iter().map(|i| files[i as usize]);
        struct Slot {
            file: usize,
            record: u64,
            plan: Vec<Req>,
            issued: usize,
        }
        let open = |file: usize| {
            let f = &self.layout.files[file];
            let size = formats::shape(Format::TfRecord, spf, f.sample).size;
            Slot { file, record: 0, plan: formats::tfrecord_plan(size, self.tf_buffer), issued: 0 }
        };
        let mut slots: Vec<Option<Slot>> = (0..self.read_threads.max(1)).map(|_| queue.next().map(open)).collect();
        let mut batches = Vec::with_capacity(self.steps_per_epoch as usize);
        let mut cur = Batch::default();
        while batches.len() < self.steps_per_epoch as usize && slots.iter().any(Option::is_some) {
            for (s, slot) in slots.iter_mut().enumerate() {
                let Some(st) = slot else { continue };
                let sample = self.layout.files[st.file].sample;
                let end = (st.record + 1) * (sample + formats::TFRECORD_FRAME);
                st.record += 1;
                let last = st.record == spf;
                while st.issued < st.plan.len() && (last || st.plan[st.issued].0 < end) {
                    let (offset, len) = st.plan[st.issued];
                    st.issued += 1;
                    let close = st.issued == st.plan.len();
                    cur.reads.push(SampleRead { close, ..SampleRead::new(st.file as u32, offset, len) });
                    cur.streams.push(s as u32);
                }
                cur.samples += 1;
                if last {
                    *slot = queue.next().map(open);
                }
                if cur.samples as u64 == self.batch_size {
                    batches.push(std::mem::take(&mut cur));
                    if batches.len() == self.steps_per_epoch as usize {
                        break;
                    }
                }
            }
        }
        batches.resize_with(self.steps_per_epoch as usize, Batch::default);
        batches
    }

    /// indexed_binary: the index reads DLIO's reader makes when it is made, put before the
    /// first batch its worker reads: per file of the shard, its offsets then its sizes,
    /// each opened and read whole. PyTorch makes a reader in each worker process (the
    /// first batch of each of the `read_threads` workers, DataLoader's persistent workers:
    /// epoch 0 only); DALI makes one in the GPU's process (DaliIndexDataset) before its
    /// workers start (batch 0).
    fn index_reads(&self, gpu: usize, epoch: u64, step: u64) -> Vec<SampleRead> {
        let made = match self.dali() {
            // DLIO's DALI loader makes its dataset (and reader) anew each epoch.
            true => step == 0,
            false => epoch == 0 && step < self.read_threads.max(1) as u64,
        };
        if self.format != Format::IndexedBinary || self.odirect || !made {
            return Vec::new();
        }
        let n = self.layout.files.len() as u32;
        let (offset, len) = indexed::index_read(self.layout.samples_per_file, self.blksize);
        // Each index file opened, read whole and closed (close: for DALI's recorded-mode
        // reads, which keep a file open until a read says otherwise).
        self.shards[gpu]
            .1
            .iter()
            .flat_map(|&f| {
                [0, 1].map(|j| SampleRead { close: true, ..SampleRead::new(n + 2 * f as u32 + j, offset, len) })
            })
            .collect()
    }

    /// `data_loader: dali` (DLIO's DaliDataLoader): a pipeline whose parallel
    /// external_source runs `read_threads` Python worker processes and keeps
    /// `prefetch_size` batches scheduled; each batch's samples are split among the workers
    /// (dali_worker). TFRecord keeps TensorFlow's interleave.
    fn dali(&self) -> bool {
        self.loader == "dali" && self.format != Format::TfRecord
    }

    /// A name of sample `k` of data file `file` of its own, so that in DALI's model (where
    /// an open file is shared by the reads naming it, recorded mode) two workers reading
    /// samples of one file concurrently open it each, as DLIO's reader does per sample.
    fn sample_alias(&self, file: usize, k: u64) -> u32 {
        let n = self.layout.files.len() as u64;
        u32::try_from(3 * n + file as u64 * self.layout.samples_per_file + k).unwrap_or(file as u32)
    }

    /// mmap_indexed_binary: what DLIO's get_sample does to the mapped files for sample
    /// `k` of `file` (its index entries read through the mappings, the data untouched).
    fn touch_mapped(&self, file: usize, k: u64) {
        let mut mapped = self.mapped.borrow_mut();
        if let std::collections::hash_map::Entry::Vacant(e) = mapped.entry(file) {
            match indexed::Mapped::open(&self.layout.path(file)) {
                Ok(m) => {
                    e.insert(m);
                }
                Err(err) => {
                    eprintln!("trainio replay: {err}");
                    return;
                }
            }
        }
        std::hint::black_box(mapped[&file].sample(k));
    }

    /// The order in which GPU `gpu` reads its shard's samples in `epoch`.
    pub fn sample_order(&self, gpu: usize, epoch: u64) -> Vec<u32> {
        let global = self.shards[gpu].0;
        let spf = self.layout.samples_per_file as u32;
        // Seeded shuffles differ per epoch and per GPU but repeat from run to run.
        let base = self.seed ^ (epoch << 32) ^ (global << 8);
        let rng = |kind: u64, s: Shuffle| {
            let salt = if s == Shuffle::Random { rand::random::<u64>() } else { 0 };
            StdRng::seed_from_u64(base ^ kind ^ salt)
        };
        let file_order = self.file_order(gpu, epoch);
        let mut order: Vec<u32> = file_order.iter().flat_map(|&f| (0..spf).map(move |s| f * spf + s)).collect();
        if self.sample_shuffle != Shuffle::Off {
            order.shuffle(&mut rng(2, self.sample_shuffle));
        }
        order
    }
}

impl Program for WorkloadProgram {
    fn epochs(&self) -> u64 {
        self.epochs
    }

    fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    fn batch(&self, gpu: usize, epoch: u64, step: u64) -> Batch {
        let mut batch = self.batch_reads(gpu, epoch, step);
        if self.sleeps_preprocess() {
            self.add_preprocess(&mut batch, gpu, epoch, step);
        }
        batch
    }

    fn compute_seconds(&self, _gpu: usize, _epoch: u64, _step: u64, rng: &mut StdRng) -> f64 {
        self.compute.sample(rng)
    }

    fn path(&self, file: u32) -> PathBuf {
        let (n, file) = (self.layout.files.len(), file as usize);
        if file >= 3 * n {
            // A sample's own name for its data file (sample_alias).
            return self.layout.path((file - 3 * n) / self.layout.samples_per_file.max(1) as usize);
        }
        match file.checked_sub(n) {
            // An index file (index_reads): 2 × data file + 0 (offsets) or 1 (sizes).
            Some(i) => indexed::index_paths(&self.layout.path(i / 2))[i % 2].clone(),
            None => self.layout.path(file),
        }
    }

    fn root(&self) -> &std::path::Path {
        &self.layout.root
    }

    fn read_threads(&self, _gpu: usize) -> usize {
        self.read_threads
    }

    fn prefetch_size(&self, _gpu: usize) -> usize {
        self.prefetch_size
    }

    fn max_request(&self) -> u64 {
        let largest = self.layout.files.iter().map(|f| f.sample).max().unwrap_or(1);
        let plain = self.transfer_size.min(largest);
        // A format reader's requests are issued whole when they fit this; longer ones (npy's
        // read of the array) go in pieces of it.
        match (self.odirect, self.format) {
            (_, Format::TfRecord) => plain.max(self.tf_buffer),
            (false, Format::Npz | Format::Npy) => plain.max(formats::NUMPY_BUFFER.max(self.blksize)),
            // h5py reads a row (a chunk of `c` rows when chunked) in one pread; one longer
            // than transfer_size goes in pieces of it, so buffers stay that size whatever
            // the samples' size.
            (_, Format::Hdf5(c)) => self.transfer_size.min(largest * c.max(1)).max(crate::formats::hdf5::SIEVE),
            // One readinto of the whole sample, of the whole index file.
            (false, Format::IndexedBinary) => {
                largest.max(indexed::index_bytes(self.layout.samples_per_file)).max(self.blksize)
            }
            // pyarrow's reads are issued whole: the footer's, a row group's coalesced ranges.
            (_, Format::Parquet) => self.layout.parquet.as_ref().map_or(plain, |p| {
                let rgs = (0..p.row_groups.len()).flat_map(|rg| p.row_group_reads(rg));
                rgs.chain(p.footer_reads()).map(|(_, len)| len).max().unwrap_or(plain)
            }),
            (false, Format::Jpeg) => crate::formats::jpeg::PIL_BLOCK.max(self.blksize),
            _ => plain,
        }
    }

    /// TFRecord files are streamed: each read goes to its interleave slot's reader, files
    /// stay open until their last read. DALI's workers share each batch (dali_worker).
    fn recorded(&self) -> bool {
        self.format == Format::TfRecord || self.dali()
    }
}

/// The DALI worker that reads sample `j` of a batch of `n`: DALI's WorkerPool splits a
/// batch's samples into contiguous chunks, one per worker, the first `n mod workers`
/// chunks one sample longer (nvidia/dali/_multiproc/pool.py, `_distribute`).
pub fn dali_worker(j: usize, n: usize, workers: usize) -> usize {
    let w = workers.max(1);
    let (chunk, extra) = (n / w, n % w);
    // The first `extra` workers take chunk + 1 samples.
    let long = extra * (chunk + 1);
    if j < long {
        j / (chunk + 1)
    } else {
        extra + (j - long) / chunk.max(1)
    }
}

#[cfg(test)]
#[path = "program_tests.rs"]
mod tests;
