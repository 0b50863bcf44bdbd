//! HDF5 files as DLIO's hdf5 generator writes them with h5py (`h5py.File(name, 'w',
//! libver='latest')`, a contiguous uint8 dataset `records_0` and an int64 `labels`), and
//! the reads h5py (HDF5 2.0) issues to open one and take one row, as DLIO's hdf5 reader
//! does per sample (`h5py.File(f, 'r')['records_0'][k]`).
//!
//! The file is byte for byte what h5py writes for the same arrays (tests/formats): a
//! 2048-byte metadata block (HDF5's metadata aggregator) holding the version-3
//! superblock, the root group's version-2 object header (compact links to both
//! datasets) and the two datasets' object headers, every one checksummed with Jenkins'
//! lookup3; then `records_0`, shape (samples per file, sample bytes), row k = sample k;
//! then `labels`, shape (samples per file,), zeros.
//!
//! With `dataset.chunk_dims` (DLIO passes it to `create_dataset(..., chunks=...)`),
//! `records_0` is chunked along the samples: chunks of `c` whole rows, `c` the first of
//! chunk_dims (workload.rs says which chunk_dims map so). As h5py writes it: the layout
//! message (version 4) points at a Fixed Array chunk index, a header (FAHD) and a data
//! block (FADB) of one address per chunk, both in the metadata block after the dataset's
//! header; chunk i at `DATA + i × c × sample`, the last one whole (zeros past the
//! dataset's end). That holds while the index and `labels`' header fit in the metadata
//! block, up to CHUNKS_MAX chunks; h5py places them elsewhere beyond.

/// The metadata block: the datasets' bytes start here.
pub const DATA: u64 = 2048;
/// Where the objects lie inside the metadata block.
const ROOT: u64 = 48;
const ROOT_LEN: u64 = 131;
const RECORDS: u64 = ROOT + ROOT_LEN;
const DSET_LEN: u64 = 268;
/// libhdf5's speculative read of an object header (H5O_SPEC_READ_SIZE).
const SPEC_READ: u64 = 512;
/// libhdf5's default sieve buffer (H5Pset_sieve_buf_size).
pub const SIEVE: u64 = 64 << 10;
const UNDEF: u64 = u64::MAX;
/// The chunked dataset's Fixed Array index: its header (FAHD) and data block (FADB,
/// FADB_LEN bytes around one 8-byte address per chunk).
const FAHD: u64 = RECORDS + DSET_LEN;
const FAHD_LEN: u64 = 28;
const FADB: u64 = FAHD + FAHD_LEN;
const FADB_LEN: u64 = 18;
/// libhdf5's Fixed Array page bits (H5D_FARRAY_MAX_DBLK_PAGE_NELMTS_BITS).
const PAGE_BITS: u8 = 10;
/// Most chunks whose index and `labels`' header fit in the metadata block (measured:
/// h5py moves `labels`' header and the chunks at 161).
pub const CHUNKS_MAX: u64 = 160;

/// Chunks of `chunk` rows (0: contiguous, one "chunk") holding `spf` rows.
fn chunks(spf: u64, chunk: u64) -> u64 {
    if chunk == 0 {
        0
    } else {
        spf.div_ceil(chunk)
    }
}

/// Bytes of `records_0`'s data: the rows, or whole chunks (zeros past the last row).
pub fn payload(spf: u64, sample: u64, chunk: u64) -> u64 {
    if chunk == 0 {
        spf * sample
    } else {
        chunks(spf, chunk) * chunk * sample
    }
}

/// Where `labels`' object header lies.
fn labels_at(spf: u64, chunk: u64) -> u64 {
    if chunk == 0 {
        FAHD
    } else {
        FADB + FADB_LEN + 8 * chunks(spf, chunk)
    }
}

/// Whether a file of `spf` rows in chunks of `chunk` rows is laid out as this module
/// writes it (h5py's layout up to CHUNKS_MAX chunks).
pub fn chunking_fits(spf: u64, chunk: u64) -> bool {
    chunk >= 1 && chunk <= spf && chunks(spf, chunk) <= CHUNKS_MAX
}

/// A workload's samples as its hdf5 files hold them: `dataset.chunk_dims`, the record
/// length (mean and stdev) and `num_samples_per_file`.
pub struct Samples<'a> {
    pub chunk_dims: &'a [u64],
    pub record_length: f64,
    pub record_length_stdev: f64,
    pub per_file: u64,
}

/// Rows per chunk of `records_0` for a workload's samples `w` (0: contiguous): chunk_dims (DLIO's
/// chunk shape for its (samples, d1, d2) records) maps onto the (samples, sample bytes)
/// rows as chunks of chunk_dims[0] whole rows when the other dims cover a sample
/// (their product at least record_length_bytes), chunk_dims[0] is at most
/// num_samples_per_file, a chunk is under 4 GiB, and a file has at most CHUNKS_MAX
/// chunks. Any other chunk_dims is written contiguous (unmodeled.rs says so).
pub fn chunk_rows(w: &Samples) -> u64 {
    let Some((&c0, rest)) = w.chunk_dims.split_first() else { return 0 };
    let covers = rest.iter().try_fold(1u64, |p, &d| p.checked_mul(d)).is_none_or(|p| p as f64 >= w.record_length);
    let bytes = (c0 as f64) * (w.record_length + w.record_length_stdev * 6.0);
    if covers && rest.iter().all(|&d| d > 0) && bytes < u32::MAX as f64 && chunking_fits(w.per_file, c0) {
        c0
    } else {
        0
    }
}

/// Bytes of a file of `spf` samples of `sample` bytes, in chunks of `chunk` rows (0:
/// contiguous).
pub fn size(spf: u64, sample: u64, chunk: u64) -> u64 {
    DATA + payload(spf, sample, chunk) + 8 * spf
}

/// Bob Jenkins' lookup3 `hashlittle` with initval 0, HDF5's metadata checksum
/// (H5_checksum_lookup3).
pub fn lookup3(key: &[u8]) -> u32 {
    fn rot(x: u32, k: u32) -> u32 {
        x.rotate_left(k)
    }
    let mut a: u32 = 0xdead_beef_u32.wrapping_add(key.len() as u32);
    let mut b = a;
    let mut c = a;
    let word = |s: &[u8]| {
        let mut w = [0u8; 4];
        w[..s.len()].copy_from_slice(s);
        u32::from_le_bytes(w)
    };
    let mut k = key;
    while k.len() > 12 {
        a = a.wrapping_add(word(&k[0..4]));
        b = b.wrapping_add(word(&k[4..8]));
        c = c.wrapping_add(word(&k[8..12]));
        // mix(a, b, c)
        a = a.wrapping_sub(c);
        a ^= rot(c, 4);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= rot(a, 6);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= rot(b, 8);
        b = b.wrapping_add(a);
        a = a.wrapping_sub(c);
        a ^= rot(c, 16);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= rot(a, 19);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= rot(b, 4);
        b = b.wrapping_add(a);
        k = &k[12..];
    }
    if k.is_empty() {
        return c;
    }
    a = a.wrapping_add(word(&k[..k.len().min(4)]));
    if k.len() > 4 {
        b = b.wrapping_add(word(&k[4..k.len().min(8)]));
    }
    if k.len() > 8 {
        c = c.wrapping_add(word(&k[8..]));
    }
    // final(a, b, c)
    c ^= b;
    c = c.wrapping_sub(rot(b, 14));
    a ^= c;
    a = a.wrapping_sub(rot(c, 11));
    b ^= a;
    b = b.wrapping_sub(rot(a, 25));
    c ^= b;
    c = c.wrapping_sub(rot(b, 16));
    a ^= c;
    a = a.wrapping_sub(rot(c, 4));
    b ^= a;
    b = b.wrapping_sub(rot(a, 14));
    c ^= b;
    c = c.wrapping_sub(rot(b, 24));
    c
}

/// Appends the lookup3 checksum of everything from `from`.
fn seal(out: &mut Vec<u8>, from: usize) {
    let sum = lookup3(&out[from..]);
    out.extend_from_slice(&sum.to_le_bytes());
}

/// A header message: type, 2-byte size, flags, body.
fn message(out: &mut Vec<u8>, kind: u8, flags: u8, body: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&(body.len() as u16).to_le_bytes());
    out.push(flags);
    out.extend_from_slice(body);
}

/// A link message (version 1, hard link, 1-byte name length).
fn link(name: &str, addr: u64) -> Vec<u8> {
    let mut b = vec![1, 0, name.len() as u8];
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&addr.to_le_bytes());
    b
}

/// A dataset's layout message body: contiguous at `addr` of `len` bytes, or, chunked
/// (`chunk` rows, not 0), version 4: chunks of (`chunk`, dims[1]) elements of `bytes`,
/// a Fixed Array index whose header is at `addr`.
fn layout(dims: &[u64], bytes: u32, chunk: u64, addr: u64, len: u64) -> Vec<u8> {
    if chunk == 0 {
        let mut b = vec![3, 1];
        b.extend_from_slice(&addr.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
        return b;
    }
    let cdims = [chunk, dims[1], bytes as u64];
    // Bytes per chunk dimension: what the largest needs (H5VM_limit_enc_size).
    let enc = (63 - cdims.iter().max().unwrap().leading_zeros()) / 8 + 1;
    let mut b = vec![4, 2, 0, cdims.len() as u8, enc as u8];
    for d in cdims {
        b.extend_from_slice(&d.to_le_bytes()[..enc as usize]);
    }
    b.extend_from_slice(&[3, PAGE_BITS]);
    b.extend_from_slice(&addr.to_le_bytes());
    b
}

/// A dataset's object header (version 2, a 256-byte chunk): dataspace (fixed dims),
/// fixed-point datatype of `bytes` (signed or not), fill value (undefined; allocated late
/// when contiguous, incrementally when chunked), layout (`layout`), a NIL message for the
/// rest.
fn dataset(dims: &[u64], bytes: u32, signed: bool, chunk: u64, addr: u64, len: u64) -> Vec<u8> {
    let mut out = b"OHDR".to_vec();
    out.extend_from_slice(&[2, 0x01]);
    out.extend_from_slice(&256u16.to_le_bytes());
    let body = out.len();
    let mut space = vec![2, dims.len() as u8, 1, 1];
    for _ in 0..2 {
        for d in dims {
            space.extend_from_slice(&d.to_le_bytes());
        }
    }
    message(&mut out, 0x01, 0, &space);
    let mut dtype = vec![0x10, if signed { 0x08 } else { 0 }, 0, 0];
    dtype.extend_from_slice(&bytes.to_le_bytes());
    dtype.extend_from_slice(&0u16.to_le_bytes());
    dtype.extend_from_slice(&((bytes * 8) as u16).to_le_bytes());
    message(&mut out, 0x03, 0x01, &dtype);
    message(&mut out, 0x05, 0x01, &[3, if chunk == 0 { 0x0a } else { 0x0b }]);
    message(&mut out, 0x08, 0, &layout(dims, bytes, chunk, addr, len));
    let nil = 256 - (out.len() - body) - 4;
    message(&mut out, 0x00, 0, &vec![0; nil]);
    seal(&mut out, 0);
    out
}

/// The Fixed Array header and data block of `n` chunks of `bytes` each, the first at DATA.
fn fixed_array(n: u64, bytes: u64) -> Vec<u8> {
    let mut out = b"FAHD".to_vec();
    out.extend_from_slice(&[0, 0, 8, PAGE_BITS]);
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&FADB.to_le_bytes());
    seal(&mut out, 0);
    let start = out.len();
    out.extend_from_slice(b"FADB");
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&FAHD.to_le_bytes());
    for i in 0..n {
        out.extend_from_slice(&(DATA + i * bytes).to_le_bytes());
    }
    seal(&mut out, start);
    out
}

/// The metadata block (DATA bytes) of a file of `spf` samples of `sample` bytes, in
/// chunks of `chunk` rows (0: contiguous; else `chunking_fits`).
pub fn metadata(spf: u64, sample: u64, chunk: u64) -> Vec<u8> {
    debug_assert!(chunk == 0 || chunking_fits(spf, chunk));
    let payload = payload(spf, sample, chunk);
    let labels = labels_at(spf, chunk);
    let mut out = b"\x89HDF\r\n\x1a\n".to_vec();
    out.extend_from_slice(&[3, 8, 8, 0]);
    for v in [0, UNDEF, size(spf, sample, chunk), ROOT] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    seal(&mut out, 0);
    // The root group: link info (no dense storage), group info, a link per dataset.
    let start = out.len();
    out.extend_from_slice(b"OHDR");
    out.extend_from_slice(&[2, 0x00, 120]);
    let mut info = vec![0, 0];
    info.extend_from_slice(&UNDEF.to_le_bytes());
    info.extend_from_slice(&UNDEF.to_le_bytes());
    message(&mut out, 0x02, 0, &info);
    message(&mut out, 0x0a, 0x01, &[0, 0]);
    message(&mut out, 0x06, 0, &link("records_0", RECORDS));
    message(&mut out, 0x06, 0, &link("labels", labels));
    let nil = 120 - (out.len() - start - 7) - 4;
    message(&mut out, 0x00, 0, &vec![0; nil]);
    seal(&mut out, start);
    if chunk == 0 {
        out.extend(dataset(&[spf, sample], 1, false, 0, DATA, payload));
    } else {
        out.extend(dataset(&[spf, sample], 1, false, chunk, FAHD, 0));
        out.extend(fixed_array(chunks(spf, chunk), chunk * sample));
    }
    debug_assert_eq!(out.len() as u64, labels);
    out.extend(dataset(&[spf], 8, true, 0, DATA + payload, 8 * spf));
    debug_assert_eq!(out.len() as u64, labels + DSET_LEN);
    out.resize(DATA as usize, 0);
    out
}

/// The labels' bytes (int64 zeros, DLIO's `[0] * num_samples`).
pub fn labels(spf: u64) -> Vec<u8> {
    vec![0; 8 * spf as usize]
}

/// h5py's reads (HDF5 2.0, default file access properties) to open a file of `spf`
/// samples of `sample` bytes and read row `k` of `records_0`, measured with `trainio
/// record` (docs/design/formats.md): the signature (8 at 0), the superblock (48 at
/// 0), the root group's object header and the dataset's (512 each, libhdf5's speculative
/// read), then the row: through the 64 KiB sieve buffer when it is smaller (from the
/// row to the sieve's size or the dataset's end, whichever comes first), else the row.
/// Chunked (`chunk` rows > 0), after the dataset's header: the Fixed Array's header and
/// data block, then the whole chunk holding row `k` (measured up to 2 MiB chunks, past
/// the 1 MiB chunk cache too).
pub fn plan(spf: u64, sample: u64, chunk: u64, k: u64) -> Vec<(u64, u64)> {
    if chunk > 0 {
        let bytes = chunk * sample;
        return vec![
            (0, 8),
            (0, 48),
            (ROOT, SPEC_READ),
            (RECORDS, SPEC_READ),
            (FAHD, FAHD_LEN),
            (FADB, FADB_LEN + 8 * chunks(spf, chunk)),
            (DATA + k / chunk * bytes, bytes),
        ];
    }
    let at = DATA + k * sample;
    let left = spf * sample - k * sample;
    let row = if sample >= SIEVE { sample } else { SIEVE.min(left) };
    vec![(0, 8), (0, 48), (ROOT, SPEC_READ), (RECORDS, SPEC_READ), (at, row)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup3_known_values() {
        // lookup3.c's driver5: hashlittle("", 0, 0) and "Four score and seven years ago".
        assert_eq!(lookup3(b""), 0xdead_beef);
        assert_eq!(lookup3(b"Four score and seven years ago"), 0x1777_0551);
    }

    #[test]
    fn superblock_is_h5pys() {
        // The first 48 bytes of h5py's file of records_0 = uint8 (8, 131072), labels (8,).
        let want = "894844460d0a1a0a030808000000000000000000ffffffffffffffff4008\
                    10000000000030000000000000000704d1f7";
        let got: String = metadata(8, 131072, 0)[..48].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want);
        assert_eq!(size(8, 131072, 0), 1050688);
    }

    #[test]
    fn objects_lie_where_the_plan_reads() {
        let m = metadata(4, 8192, 0);
        const LABELS: u64 = RECORDS + DSET_LEN;
        assert_eq!(&m[ROOT as usize..ROOT as usize + 4], b"OHDR");
        assert_eq!(&m[RECORDS as usize..RECORDS as usize + 4], b"OHDR");
        assert_eq!(&m[LABELS as usize..LABELS as usize + 4], b"OHDR");
        assert!(m[(LABELS + DSET_LEN) as usize..].iter().all(|&b| b == 0));
    }

    #[test]
    fn rows_go_through_the_sieve_when_smaller() {
        // Measured (strace) on h5py's files: (64, 4096) rows 0 and 63, (4, 40960) row 3,
        // (2, 65536) row 1, (8, 131072) row 3.
        assert_eq!(plan(64, 4096, 0, 0)[4], (2048, 65536));
        assert_eq!(plan(64, 4096, 0, 63)[4], (260096, 4096));
        assert_eq!(plan(4, 40960, 0, 3)[4], (124928, 40960));
        assert_eq!(plan(2, 65536, 0, 1)[4], (67584, 65536));
        assert_eq!(plan(8, 131072, 0, 3), [(0, 8), (0, 48), (48, 512), (179, 512), (395264, 131072)]);
    }

    #[test]
    fn chunked_rows_read_the_index_then_the_whole_chunk() {
        // Measured (strace) on h5py's files: (8, 4096) in chunks of 2 rows, row 3;
        // (16, 40960) in chunks of 4, row 3; (4, 1 MiB) in chunks of 2, row 1.
        let head = [(0, 8), (0, 48), (48, 512), (179, 512), (447, 28)];
        assert_eq!(plan(8, 4096, 2, 3), [&head[..], &[(475, 50), (10240, 8192)]].concat());
        assert_eq!(plan(16, 40960, 4, 3), [&head[..], &[(475, 50), (2048, 163840)]].concat());
        assert_eq!(plan(4, 1 << 20, 2, 1), [&head[..], &[(475, 34), (2048, 2 << 20)]].concat());
    }

    #[test]
    fn chunked_index_and_labels_lie_in_the_metadata_block() {
        // h5py's (8, 4096) in chunks of 3: FAHD at 447, FADB at 475 with 3 chunks, labels'
        // header after it, its data after the last (whole) chunk.
        let m = metadata(8, 4096, 3);
        assert_eq!(&m[447..451], b"FAHD");
        assert_eq!(&m[475..479], b"FADB");
        assert_eq!(&m[517..521], b"OHDR");
        assert_eq!(size(8, 4096, 3), 38976);
        assert!(chunking_fits(320, 2) && !chunking_fits(322, 2) && !chunking_fits(4, 5) && !chunking_fits(4, 0));
    }
}
