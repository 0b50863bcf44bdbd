//! A dataset DLIO's generator wrote (`dlio_benchmark ++workload.workflow.generate_data=True`,
//! or `mlpstorage training datagen`, which runs it), replayed in place instead of a
//! trainio dataset (docs/replay.md, *Dataset*). A v3.0 dataset takes hours to generate;
//! one that is there already is used as it is, nothing written into it but the run's lock.
//!
//! The layout the workload file implies is checked before anything is read: DLIO names
//! file i of N `train/img_<i>_of_<N>.<format>`, i zero-padded to the digits of N, and with
//! `num_subfolders_train` S > 1 puts it in `train/<i mod S>/`, padded to the digits of S
//! (dlio_benchmark/data_generator/data_generator.py). Every one of the N files must be
//! there and not empty, and their mean size must be about num_samples_per_file ×
//! record_length_bytes; a mismatch is refused in one line. The file sizes are DLIO's
//! (drawn from record_length_bytes_stdev), not trainio's: each file is taken at its size
//! and read whole, in transfer-size requests. The reads numpy.load makes of DLIO's npz (two
//! members, `x` and `y`) are not modeled; the note says so.

use crate::dataset::{DataFile, Layout};
use crate::formats::Format;
use crate::workload::Workload;
use std::path::{Path, PathBuf};

/// DLIO's `dataset.file_prefix` default.
pub const FILE_PREFIX: &str = "img";

/// True when `root` holds no trainio dataset but has DLIO's `train/` directory.
pub fn looks_like(root: &Path) -> bool {
    !root.join(crate::dataset::MARKER).exists() && root.join("train").is_dir()
}

/// Path, relative to the data directory, DLIO gives training file `i` of the workload.
pub fn file_name(w: &Workload, i: u64) -> PathBuf {
    let n = w.num_files_train;
    let digits = n.to_string().len();
    let name = format!("{FILE_PREFIX}_{i:0digits$}_of_{n}.{}", w.format.to_ascii_lowercase());
    let subfolders = w.num_subfolders_train;
    if subfolders > 1 {
        let sd = subfolders.to_string().len();
        PathBuf::from("train").join(format!("{:0sd$}", i % subfolders)).join(name)
    } else {
        PathBuf::from("train").join(name)
    }
}

/// The files DLIO's training files of the same extension in `train/` (and its
/// subfolders) that are there, for the message that says what the directory holds.
fn present(root: &Path, ext: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![root.join("train")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().and_then(|x| x.to_str()) == Some(ext) {
                out.push(p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
            }
        }
    }
    out.sort();
    out
}

/// The dataset in `root` as the workload implies it, for `needed` files (the run's
/// layout: at least num_files_train); Err is the one line that says what does not match.
pub fn layout(w: &Workload, base: &Layout, needed: u64) -> Result<Layout, String> {
    let root = &base.root;
    let ext = w.format.to_ascii_lowercase();
    if ext.is_empty() {
        return Err(format!(
            "{}: a DLIO dataset's files are named by dataset.format, which the workload does not set",
            root.display()
        ));
    }
    let n = w.num_files_train;
    if needed > n {
        return Err(format!(
            "{}: the DLIO dataset holds dataset.num_files_train {n} files and this run needs {needed} (--gpus × --steps × --batch-size): lower --steps or --gpus",
            root.display()
        ));
    }
    let mut files = Vec::with_capacity(n as usize);
    let mut bytes = 0u64;
    for i in 0..n {
        let rel = file_name(w, i);
        let size = match std::fs::metadata(root.join(&rel)) {
            Ok(m) if m.is_file() && m.len() > 0 => m.len(),
            Ok(_) => return Err(format!("{}: empty or not a file", root.join(&rel).display())),
            Err(_) => {
                let there = present(root, &ext);
                let holds = match (there.first(), there.last()) {
                    (Some(a), Some(b)) => format!("train/ holds {} .{ext} files ({a} … {b})", there.len()),
                    _ => format!("train/ holds no .{ext} file"),
                };
                return Err(format!(
                    "{}: missing: the workload implies DLIO's {n} files {} … {} and {holds}; not a trainio dataset either (run 'trainio datagen' or pass --generate into an empty directory)",
                    root.join(&rel).display(),
                    file_name(w, 0).display(),
                    file_name(w, n - 1).display()
                ));
            }
        };
        bytes += size;
        let spf = w.num_samples_per_file.max(1);
        files.push(DataFile { rel, size, sample: size.div_ceil(spf) });
    }
    // The sizes: their mean against num_samples_per_file × record_length_bytes, allowing
    // for the stdev's spread over n files and the format's own bytes (headers, labels).
    let mean = bytes as f64 / n as f64;
    let spf = w.num_samples_per_file.max(1) as f64;
    let expected = spf * w.record_length;
    let spread = 4.0 * spf * w.record_length_stdev / (n as f64).sqrt();
    let slack = 0.1 * expected + spread + 64.0 * 1024.0;
    if (mean - expected).abs() > slack {
        return Err(format!(
            "{}: DLIO's {n} files average {mean:.0} B, and the workload implies {expected:.0} B a file (num_samples_per_file × record_length_bytes, ± {slack:.0} B): not the dataset of this workload",
            root.join("train").display()
        ));
    }
    let mut layout = base.clone();
    layout.files = files;
    layout.format = Format::Raw;
    layout.description = format!("DLIO's dataset of workload {} (in place)", w.name);
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(files: u64, subfolders: u64) -> Workload {
        let y = format!(
            "dataset:\n  format: npz\n  num_files_train: {files}\n  num_subfolders_train: {subfolders}\n  record_length_bytes: 1000\nreader:\n  batch_size: 1\ntrain:\n  computation_time: 0.1\n"
        );
        Workload::from_yaml(&y, "t").unwrap()
    }

    #[test]
    fn names_as_dlio_gives_them() {
        assert_eq!(file_name(&workload(8, 0), 3), Path::new("train/img_3_of_8.npz"));
        assert_eq!(file_name(&workload(168, 0), 7), Path::new("train/img_007_of_168.npz"));
        assert_eq!(file_name(&workload(12, 1), 7), Path::new("train/img_07_of_12.npz"), "one subfolder is none");
        assert_eq!(file_name(&workload(12, 10), 7), Path::new("train/07/img_07_of_12.npz"));
    }

    #[test]
    fn the_layout_is_checked() {
        let dir = std::env::temp_dir().join(format!("trainio-dlio-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("train")).unwrap();
        let w = workload(4, 0);
        let base = Layout::from_workload(&w, 1, 0, &dir);
        for i in 0..3 {
            std::fs::write(dir.join(file_name(&w, i)), vec![1u8; 1000 + i as usize]).unwrap();
        }
        let e = layout(&w, &base, 4).unwrap_err();
        assert!(e.contains("img_3_of_4.npz: missing") && e.contains("train/ holds 3 .npz files"), "{e}");
        std::fs::write(dir.join(file_name(&w, 3)), vec![1u8; 1003]).unwrap();
        let l = layout(&w, &base, 4).unwrap();
        assert_eq!(l.files.iter().map(|f| f.size).collect::<Vec<_>>(), [1000, 1001, 1002, 1003]);
        assert_eq!(l.format, Format::Raw);
        assert!(layout(&w, &base, 5).unwrap_err().contains("needs 5"));
        // A file 400 times the record length: a mean of 100 KB, beyond 10 % + 64 KiB of
        // the 1000 B the workload implies.
        std::fs::write(dir.join(file_name(&w, 3)), vec![1u8; 400_000]).unwrap();
        assert!(layout(&w, &base, 4).unwrap_err().contains("average"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
