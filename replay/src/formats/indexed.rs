//! DLIO's `indexed_binary` and `mmap_indexed_binary` formats: the files datagen writes and
//! the reads DLIO's two readers make of them (docs/design/formats.md).
//!
//! Layout (DLIO's IndexedBinaryGenerator): per data file FILE, the samples back to back in
//! FILE, and two index files beside it, `FILE.off.idx` and `FILE.sz.idx`: one
//! little-endian u64 per sample, its offset in FILE and its size. DLIO lists a dataset's
//! files as those whose names end with the format (`*.indexed_binary`), so the index
//! files are not taken for data files.
//!
//! Readers (dlio_benchmark/reader/indexed_binary_reader.py, indexed_binary_mmap_reader.py):
//! - `indexed_binary`: when the reader is made (once per DataLoader worker), for every
//!   file it may read, both index files are opened and read whole with one
//!   `BufferedReader.readinto` each; then per sample the file is opened, `seek` to the
//!   sample, `readinto` an array of the sample's size, closed. CPython's readinto of n
//!   bytes on an empty buffer of `bs` (st_blksize) is one read syscall: of n bytes when
//!   n > bs, else of `bs` (a buffer fill): measured with strace, CPython 3.11.
//! - `mmap_indexed_binary`: at the reader's making, np.memmap of both index files and of
//!   the data file (open, mmap, close: no read); per sample, the sample's offset and size
//!   are taken from the mapped index arrays (touching the index pages) and the sample is
//!   `buffer[offset:offset+size]`, a view whose pages are never touched: DLIO then
//!   returns its preallocated `resized_image`. So the data files are not read at all;
//!   only the index pages holding the samples' entries are faulted in (measured: after
//!   a run with the page cache dropped, fincore shows 0 pages of the data files resident).
//!   The replay maps the same files and touches the same index entries, so the kernel
//!   reads what it read for DLIO, fault read-around included; the file layer does not see
//!   page faults (docs/design/recorder.md), only the block layer does.
//!
//! Both readers refuse O_DIRECT (DLIO's reader factory raises).

use crate::formats::{Format, Req};
use std::path::{Path, PathBuf};

/// Bytes of one index entry (a u64 offset or size).
pub const ENTRY: u64 = 8;

pub fn is_indexed(format: Format) -> bool {
    matches!(format, Format::IndexedBinary | Format::MmapIndexedBinary)
}

/// The index files of data file `data`: offsets, then sizes.
pub fn index_paths(data: &Path) -> [PathBuf; 2] {
    let name = data.as_os_str();
    let with = |suffix: &str| {
        let mut s = name.to_os_string();
        s.push(suffix);
        PathBuf::from(s)
    };
    [with(".off.idx"), with(".sz.idx")]
}

/// Bytes of each index file of a data file of `spf` samples.
pub fn index_bytes(spf: u64) -> u64 {
    spf * ENTRY
}

/// The two index files' contents for `spf` samples of `sample` bytes, back to back.
pub fn index_contents(spf: u64, sample: u64) -> [Vec<u8>; 2] {
    let offsets = (0..spf).flat_map(|k| (k * sample).to_le_bytes()).collect();
    let sizes = (0..spf).flat_map(|_| sample.to_le_bytes()).collect();
    [offsets, sizes]
}

/// The read syscall of CPython's `BufferedReader.readinto` of `n` bytes at `offset` on a
/// freshly opened (or just seeked, buffer empty) file with a buffer of `bs`.
pub fn readinto(offset: u64, n: u64, bs: u64) -> Req {
    (offset, if n > bs { n } else { bs })
}

/// The read of one index file at the reader's making (`readinto` of spf int64 values).
pub fn index_read(spf: u64, bs: u64) -> Req {
    readinto(0, index_bytes(spf), bs)
}

/// The read of sample `k` of `sample` bytes (seek to it, `readinto` its bytes).
pub fn sample_read(k: u64, sample: u64, bs: u64) -> Req {
    readinto(k * sample, sample, bs)
}

/// A read-only shared mapping of a whole file, as np.memmap(mode='r') makes it.
pub struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    pub fn open(path: &Path) -> std::io::Result<Mapping> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path)?;
        let len = file.metadata()?.len() as usize;
        if len == 0 {
            return Ok(Mapping { ptr: std::ptr::null_mut(), len: 0 });
        }
        // SAFETY: a new read-only mapping of an open file; the descriptor may close after.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr, len })
    }

    /// The little-endian u64 at entry `k`, read through the mapping (faulting its page in
    /// as numpy's indexing of the mapped array does); None past the end.
    pub fn entry(&self, k: u64) -> Option<u64> {
        let at = (k * ENTRY) as usize;
        if at + ENTRY as usize > self.len {
            return None;
        }
        // SAFETY: in bounds of a live mapping; volatile so the load (the fault) happens.
        let v = unsafe { std::ptr::read_volatile(self.ptr.cast::<u8>().add(at).cast::<[u8; 8]>()) };
        Some(u64::from_le_bytes(v))
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: the mapping made in open(), unmapped once.
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }
}

/// The mappings np.memmap makes of one data file: its offsets, its sizes, its bytes.
pub struct Mapped {
    pub offsets: Mapping,
    pub sizes: Mapping,
    /// Mapped as DLIO maps it, and never touched.
    _data: Mapping,
}

impl Mapped {
    pub fn open(data: &Path) -> std::io::Result<Mapped> {
        let [off, sz] = index_paths(data);
        let map = |p: &Path| {
            Mapping::open(p).map_err(|e| std::io::Error::new(e.kind(), format!("mapping {}: {e}", p.display())))
        };
        Ok(Mapped { offsets: map(&off)?, sizes: map(&sz)?, _data: map(data)? })
    }

    /// What DLIO's get_sample does for sample `k`: the sample's offset and size from the
    /// mapped indexes; the slice of the data it then takes touches no page.
    pub fn sample(&self, k: u64) -> Option<(u64, u64)> {
        Some((self.offsets.entry(k)?, self.sizes.entry(k)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readinto_is_one_syscall_of_the_bytes_or_the_buffer() {
        // strace of CPython 3.11, st_blksize 4096: readinto of 32 B and 4096 B read 4096,
        // of 4800 B read 4800; a 1 MiB sample after seek(2 MiB) reads 1 MiB there.
        assert_eq!(index_read(4, 4096), (0, 4096));
        assert_eq!(index_read(512, 4096), (0, 4096));
        assert_eq!(index_read(600, 4096), (0, 4800));
        assert_eq!(sample_read(2, 1 << 20, 4096), (2 << 20, 1 << 20));
        assert_eq!(sample_read(3, 4096, 4096), (12288, 4096));
    }

    #[test]
    fn index_paths_append_to_the_name() {
        let [o, s] = index_paths(Path::new("/d/train/file_000001.indexed_binary"));
        assert_eq!(o, Path::new("/d/train/file_000001.indexed_binary.off.idx"));
        assert_eq!(s, Path::new("/d/train/file_000001.indexed_binary.sz.idx"));
    }

    #[test]
    fn mapped_entries_are_the_index() {
        let dir = std::env::temp_dir().join(format!("trainio-indexed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data = dir.join("f.indexed_binary");
        std::fs::write(&data, vec![1u8; 3 * 8192]).unwrap();
        let [o, s] = index_paths(&data);
        let [offs, sizes] = index_contents(3, 8192);
        assert_eq!(offs.len(), 24);
        std::fs::write(&o, offs).unwrap();
        std::fs::write(&s, sizes).unwrap();
        let m = Mapped::open(&data).unwrap();
        assert_eq!(m.sample(0), Some((0, 8192)));
        assert_eq!(m.sample(2), Some((16384, 8192)));
        assert_eq!(m.sample(3), None);
        drop(m);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
