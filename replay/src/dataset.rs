//! The dataset on storage: which files exist, how big they are, who owns the directory,
//! and how files are sharded over simulated GPUs.
//!
//! File sizes are a pure function of (workload seed, file index), so a dataset generated
//! for N GPUs can be grown for 2N later without rewriting what is there, and every rank
//! of an MPI job computes the same layout without talking to the others.
//!
//! Ownership: `trainio datagen` writes only under `--data-dir`. It marks the directory
//! with `.trainio-dataset` (JSON) and refuses to write into a non-empty directory without
//! that marker, or into a device node, unless `--force` is given.

use crate::formats::parquet_files as formats_parquet;
use crate::formats::{self, Format};
use crate::workload::Workload;
use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

pub const MARKER: &str = ".trainio-dataset";
/// File and sample sizes are rounded up to this so O_DIRECT reads stay aligned.
pub const ALIGN: u64 = 4096;
/// The most files a dataset may have: its layout is held in memory (about 100 B a
/// file), and no MLPerf Storage workload needs more at the sizes its rules give.
pub const MAX_FILES: u64 = 20_000_000;

#[derive(Debug, Clone)]
pub struct DataFile {
    /// Path relative to the data directory.
    pub rel: PathBuf,
    pub size: u64,
    /// Bytes of one sample (the file's size when it is not laid out in a format).
    pub sample: u64,
}

#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
    pub files: Vec<DataFile>,
    pub samples_per_file: u64,
    pub description: String,
    /// The files' format (formats.rs): how datagen writes them and the replay reads them.
    pub format: Format,
    /// Parquet: where the row groups and column chunks of every file lie (all files have
    /// the same).
    pub parquet: Option<std::sync::Arc<formats_parquet::FileLayout>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    tool: String,
    version: u32,
    description: String,
    files: u64,
    bytes: u64,
}

pub fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

impl Layout {
    /// Files needed so that each of `gpus` simulated GPUs owns `steps` full batches
    /// (at least one), or num_files_train if that is more.
    /// Saturates rather than overflows: `Job::layout` refuses anything above MAX_FILES.
    pub fn files_for(workload: &Workload, gpus: u64, steps: u64) -> u64 {
        let per_gpu = workload.batch_size.saturating_mul(steps.max(1)).div_ceil(workload.num_samples_per_file.max(1));
        workload.num_files_train.max(gpus.saturating_mul(per_gpu))
    }

    pub fn from_workload(workload: &Workload, gpus: u64, steps: u64, root: &Path) -> Layout {
        let n = Layout::files_for(workload, gpus, steps);
        let spf = workload.num_samples_per_file;
        let normal = (workload.record_length_stdev > 0.0)
            .then(|| Normal::new(workload.record_length, workload.record_length_stdev).ok())
            .flatten();
        let digits = (n.max(2) - 1).to_string().len().max(6);
        let format = match Format::parse(&workload.format) {
            Format::Hdf5(_) => Format::Hdf5(workload.hdf5_chunk_rows()),
            f => f,
        };
        let ext = match format {
            Format::Npz => "npz",
            Format::Npy => "npy",
            Format::TfRecord => "tfrecord",
            Format::Hdf5(_) => "hdf5",
            Format::IndexedBinary => "indexed_binary",
            Format::MmapIndexedBinary => "mmap_indexed_binary",
            Format::Parquet => "parquet",
            Format::Jpeg => "jpeg",
            Format::Raw => "dat",
        };
        let parquet = match (format, &workload.parquet) {
            (Format::Parquet, Some(spec)) => Some(std::sync::Arc::new(formats_parquet::FileLayout::new(spec, spf))),
            _ => None,
        };
        let files = (0..n)
            .map(|i| {
                let record = match &normal {
                    Some(d) => {
                        let mut rng =
                            rand::rngs::StdRng::seed_from_u64(workload.seed ^ (i.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
                        d.sample(&mut rng).max(1.0)
                    }
                    None => workload.record_length,
                };
                let sample = round_up((record.ceil() as u64).max(1), ALIGN);
                let name = format!("file_{i:0digits$}.{ext}");
                let rel = if workload.num_subfolders_train > 0 {
                    PathBuf::from("train").join(format!("{:04}", i % workload.num_subfolders_train)).join(name)
                } else {
                    PathBuf::from("train").join(name)
                };
                match &parquet {
                    Some(p) => DataFile { rel, size: p.size, sample: p.spec.row_bytes() },
                    None => DataFile { rel, size: formats::shape(format, spf, sample).size, sample },
                }
            })
            .collect();
        Layout {
            root: root.to_path_buf(),
            files,
            samples_per_file: spf,
            description: format!("workload {}", workload.name),
            format,
            parquet,
        }
    }

    pub fn total_bytes(&self) -> u64 {
        (0..self.files.len()).flat_map(|i| self.on_disk(i)).map(|(_, size)| size).sum()
    }

    /// The files data file `i` is made of on disk, as (path relative to the root, bytes):
    /// the file itself, then its index files when the format has them (indexed.rs).
    pub fn on_disk(&self, i: usize) -> Vec<(PathBuf, u64)> {
        let f = &self.files[i];
        let mut out = vec![(f.rel.clone(), f.size)];
        if crate::formats::indexed::is_indexed(self.format) {
            let idx = crate::formats::indexed::index_bytes(self.samples_per_file);
            out.extend(crate::formats::indexed::index_paths(&f.rel).into_iter().map(|p| (p, idx)));
        }
        out
    }

    pub fn path(&self, file: usize) -> PathBuf {
        self.root.join(&self.files[file].rel)
    }

    /// Files of simulated GPU `gpu` of `gpus`: every `gpus`-th file, the same count for all
    /// GPUs (the remainder is left unread, as DLIO drops the last partial shard).
    pub fn shard(&self, gpu: u64, gpus: u64) -> Vec<usize> {
        let per_gpu = self.files.len() as u64 / gpus;
        (0..per_gpu).map(|k| (k * gpus + gpu) as usize).collect()
    }

    /// Files the marker of the dataset in `root` says it holds.
    pub fn marker_files(&self) -> Option<u64> {
        let text = std::fs::read(self.root.join(MARKER)).ok()?;
        serde_json::from_slice::<Marker>(&text).ok().map(|m| m.files)
    }

    /// Checks that the files `which` exist with their planned sizes. `sizing` says what
    /// sets the number of files the run needs (named when one is missing).
    pub fn verify_files(&self, which: &[usize], sizing: &str) -> Result<()> {
        if !self.root.join(MARKER).exists() {
            bail!(
                "{}: no trainio dataset here: run 'trainio datagen' with the same workload (or trace) and --gpus, or pass --generate",
                self.root.display()
            );
        }
        for (i, rel, size) in which.iter().flat_map(|&i| self.on_disk(i).into_iter().map(move |(r, s)| (i, r, s))) {
            let p = self.root.join(&rel);
            match std::fs::metadata(&p) {
                Ok(m) if m.len() == size => {}
                Ok(m) => bail!(
                    "{}: {} bytes, expected {size} (file {i}): regenerate with 'trainio datagen' or --generate",
                    p.display(),
                    m.len()
                ),
                Err(_) => {
                    let holds = match self.marker_files() {
                        Some(m) => format!("the dataset in {} holds {m}", self.root.display()),
                        None => format!("the dataset in {} holds fewer", self.root.display()),
                    };
                    bail!(
                        "{}: missing: this run needs {} files ({sizing}) and {holds}: run 'trainio datagen' with the same workload (or trace), --gpus, --steps and --batch-size, or pass --generate",
                        p.display(),
                        self.files.len()
                    )
                }
            }
        }
        Ok(())
    }
}

/// Bytes the marker of the dataset in `root` says it holds (0 without one).
pub fn marker_bytes(root: &Path) -> u64 {
    std::fs::read(root.join(MARKER))
        .ok()
        .and_then(|text| serde_json::from_slice::<Marker>(&text).ok())
        .map_or(0, |m| m.bytes)
}

/// Refuses directories that are not ours. Creates the directory when it does not exist.
pub fn claim_directory(root: &Path, force: bool) -> Result<()> {
    match std::fs::symlink_metadata(root) {
        Ok(m) => {
            let ft = m.file_type();
            if ft.is_block_device() || ft.is_char_device() {
                bail!(
                    "{}: is a device; datagen writes files into a directory: make a file system on it, mount it and pass the mount point",
                    root.display()
                );
            }
            let m = std::fs::metadata(root).with_context(|| {
                if ft.is_symlink() {
                    format!("--data-dir {}: a symbolic link to a missing directory", root.display())
                } else {
                    format!("--data-dir {}", root.display())
                }
            })?;
            if !m.is_dir() {
                bail!("{}: exists and is not a directory", root.display());
            }
            let ours = root.join(MARKER).exists();
            // The lock of the run that is claiming it (lock.rs) does not make it anyone's.
            let empty = std::fs::read_dir(root)
                .with_context(|| format!("--data-dir {}", root.display()))?
                .filter_map(|e| e.ok())
                .all(|e| e.file_name() == "lost+found" || e.file_name() == crate::lock::LOCK);
            if !ours && !empty && !force {
                bail!(
                    "{}: not empty and not a trainio dataset (no {MARKER}): refusing to write there; pass --force to use it anyway",
                    root.display()
                );
            }
        }
        Err(_) => std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?,
    }
    Ok(())
}

/// Writes the marker first, so that an interrupted datagen still marks the directory ours.
pub fn write_marker(layout: &Layout) -> Result<()> {
    let marker = Marker {
        tool: "trainio".into(),
        version: 1,
        description: layout.description.clone(),
        files: layout.files.len() as u64,
        bytes: layout.total_bytes(),
    };
    let p = layout.root.join(MARKER);
    let mut f = crate::beneath::Beneath::new(&layout.root)?.create(&p)?;
    f.write_all(&serde_json::to_vec_pretty(&marker)?).with_context(|| format!("writing {}", p.display()))
}

/// Materializes the files of `layout` whose index ≡ `part` (mod `parts`), skipping files
/// that already exist with the right size. Returns the bytes written.
pub fn generate(layout: &Layout, part: usize, parts: usize, show_progress: bool) -> Result<u64> {
    // Every file operation stays beneath the data directory (beneath.rs).
    let beneath = crate::beneath::Beneath::new(&layout.root)?;
    let mut todo = Vec::new();
    for i in (0..layout.files.len()).filter(|i| i % parts == part) {
        for (rel, size) in layout.on_disk(i) {
            if beneath.file_size(&layout.root.join(rel))? != Some(size) {
                todo.push(i);
                break;
            }
        }
    }
    let bytes: u64 = todo.iter().flat_map(|&i| layout.on_disk(i)).map(|(_, size)| size).sum();
    let bar = crate::progress::Progress::new(show_progress, "datagen", crate::progress::Unit::Bytes, bytes);
    let mut block = vec![0u8; 1 << 20];
    rand::rngs::StdRng::seed_from_u64(0x0074_7261_696e_696f).fill(&mut block[..]);
    for &i in &todo {
        let path = layout.path(i);
        if let Some(dir) = path.parent().filter(|d| *d != layout.root) {
            beneath.create_dirs(dir)?;
        }
        let file = beneath.create(&path)?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        let f = &layout.files[i];
        // A distinct stamp per MiB of payload keeps deduplicating storage from collapsing
        // the data.
        let mut fill = |buf: &mut [u8], at: u64| {
            let mut k = 0;
            while k < buf.len() {
                let pos = at + k as u64;
                let within = (pos % block.len() as u64) as usize;
                let n = (buf.len() - k).min(block.len() - within);
                buf[k..k + n].copy_from_slice(&block[within..within + n]);
                if within < 16 {
                    let mut stamp = [0u8; 16];
                    stamp[..8].copy_from_slice(&(i as u64).to_le_bytes());
                    stamp[8..].copy_from_slice(&(pos / block.len() as u64).to_le_bytes());
                    let m = (16 - within).min(n);
                    buf[k..k + m].copy_from_slice(&stamp[within..within + m]);
                }
                k += n;
            }
            bar.inc(buf.len() as u64);
        };
        let written = match (&layout.parquet, layout.format) {
            (Some(p), _) => p.write(&mut out, &mut fill).map(|_| None),
            // The file's index seeds the image's coefficients: images differ.
            (None, Format::Jpeg) => crate::formats::jpeg::write(&mut out, f.sample, i as u64).map(|_| None),
            (None, format) => formats::write_file(format, &mut out, layout.samples_per_file, f.sample, &mut fill),
        };
        let patch =
            written.and_then(|p| out.flush().map(|_| p)).with_context(|| format!("writing {}", path.display()))?;
        if let Some((at, bytes)) = patch {
            use std::os::unix::fs::FileExt;
            out.get_ref().write_all_at(&bytes, at).with_context(|| format!("writing {}", path.display()))?;
        }
        if crate::formats::indexed::is_indexed(layout.format) {
            let contents = crate::formats::indexed::index_contents(layout.samples_per_file, f.sample);
            for (p, bytes) in crate::formats::indexed::index_paths(&path).iter().zip(contents) {
                beneath.create(p)?.write_all(&bytes).with_context(|| format!("writing {}", p.display()))?;
            }
        }
    }
    // One syncfs instead of an fsync per file: O_DIRECT readers must find the data on disk.
    if let Ok(dir) = std::fs::File::open(&layout.root) {
        use std::os::fd::AsRawFd;
        unsafe { libc::syncfs(dir.as_raw_fd()) };
    }
    bar.finish();
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(stdev: f64) -> Workload {
        let y = format!("dataset:\n  num_files_train: 10\n  record_length_bytes: 100000\n  record_length_bytes_stdev: {stdev}\nreader:\n  batch_size: 4\ntrain:\n  computation_time: 0.1\n");
        Workload::from_yaml(&y, "t").unwrap()
    }

    #[test]
    fn sizes_are_stable_and_aligned() {
        let w = workload(20000.0);
        let a = Layout::from_workload(&w, 1, 0, Path::new("/x"));
        let b = Layout::from_workload(&w, 20, 0, Path::new("/x"));
        assert_eq!(a.files.len(), 10);
        assert_eq!(b.files.len(), 80, "20 GPUs × 4 samples per batch");
        for (x, y) in a.files.iter().zip(&b.files) {
            assert_eq!(x.size, y.size);
            assert_eq!(x.size % ALIGN, 0);
        }
        assert!(a.files.iter().any(|f| f.size != a.files[0].size), "stdev must vary sizes");
    }

    #[test]
    fn shards_are_disjoint() {
        let l = Layout::from_workload(&workload(0.0), 3, 0, Path::new("/x"));
        let mut all: Vec<usize> = (0..3).flat_map(|g| l.shard(g, 3)).collect();
        assert_eq!(all.len(), 12, "10 files raised to 3 GPUs × one batch of 4");
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 12);
    }

    #[test]
    fn refuses_foreign_directories() {
        let dir = std::env::temp_dir().join(format!("trainio-claim-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("precious"), b"x").unwrap();
        assert!(claim_directory(&dir, false).is_err());
        assert!(claim_directory(&dir, true).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
