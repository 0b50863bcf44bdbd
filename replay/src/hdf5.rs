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

/// The metadata block: the datasets' bytes start here.
pub const DATA: u64 = 2048;
/// Where the objects lie inside the metadata block.
const ROOT: u64 = 48;
const ROOT_LEN: u64 = 131;
const RECORDS: u64 = ROOT + ROOT_LEN;
const DSET_LEN: u64 = 268;
const LABELS: u64 = RECORDS + DSET_LEN;
/// libhdf5's speculative read of an object header (H5O_SPEC_READ_SIZE).
const SPEC_READ: u64 = 512;
/// libhdf5's default sieve buffer (H5Pset_sieve_buf_size).
pub const SIEVE: u64 = 64 << 10;
const UNDEF: u64 = u64::MAX;

/// Bytes of a file of `spf` samples of `sample` bytes.
pub fn size(spf: u64, sample: u64) -> u64 {
    DATA + spf * sample + 8 * spf
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

/// A dataset's object header (version 2, a 256-byte chunk): dataspace (fixed dims),
/// fixed-point datatype of `bytes` (signed or not), fill value (undefined, late
/// allocation), contiguous layout at `addr` of `len` bytes, a NIL message for the rest.
fn dataset(dims: &[u64], bytes: u32, signed: bool, addr: u64, len: u64) -> Vec<u8> {
    let mut out = b"OHDR".to_vec();
    out.extend_from_slice(&[2, 0x01]);
    out.extend_from_slice(&256u16.to_le_bytes());
    let chunk = out.len();
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
    message(&mut out, 0x05, 0x01, &[3, 0x0a]);
    let mut layout = vec![3, 1];
    layout.extend_from_slice(&addr.to_le_bytes());
    layout.extend_from_slice(&len.to_le_bytes());
    message(&mut out, 0x08, 0, &layout);
    let nil = 256 - (out.len() - chunk) - 4;
    message(&mut out, 0x00, 0, &vec![0; nil]);
    seal(&mut out, 0);
    out
}

/// The metadata block (DATA bytes) of a file of `spf` samples of `sample` bytes.
pub fn metadata(spf: u64, sample: u64) -> Vec<u8> {
    let payload = spf * sample;
    let mut out = b"\x89HDF\r\n\x1a\n".to_vec();
    out.extend_from_slice(&[3, 8, 8, 0]);
    for v in [0, UNDEF, size(spf, sample), ROOT] {
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
    message(&mut out, 0x06, 0, &link("labels", LABELS));
    let nil = 120 - (out.len() - start - 7) - 4;
    message(&mut out, 0x00, 0, &vec![0; nil]);
    seal(&mut out, start);
    out.extend(dataset(&[spf, sample], 1, false, DATA, payload));
    out.extend(dataset(&[spf], 8, true, DATA + payload, 8 * spf));
    debug_assert_eq!(out.len() as u64, LABELS + DSET_LEN);
    out.resize(DATA as usize, 0);
    out
}

/// The labels' bytes (int64 zeros, DLIO's `[0] * num_samples`).
pub fn labels(spf: u64) -> Vec<u8> {
    vec![0; 8 * spf as usize]
}

/// h5py's reads (HDF5 2.0, default file access properties) to open a file of `spf`
/// samples of `sample` bytes and read row `k` of `records_0`, measured with `trainio
/// record` (docs/replay.md, *Formats*): the signature (8 at 0), the superblock (48 at
/// 0), the root group's object header and the dataset's (512 each, libhdf5's speculative
/// read), then the row: through the 64 KiB sieve buffer when it is smaller (from the
/// row to the sieve's size or the dataset's end, whichever comes first), else the row.
pub fn plan(spf: u64, sample: u64, k: u64) -> Vec<(u64, u64)> {
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
        let got: String = metadata(8, 131072)[..48].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want);
        assert_eq!(size(8, 131072), 1050688);
    }

    #[test]
    fn objects_lie_where_the_plan_reads() {
        let m = metadata(4, 8192);
        assert_eq!(&m[ROOT as usize..ROOT as usize + 4], b"OHDR");
        assert_eq!(&m[RECORDS as usize..RECORDS as usize + 4], b"OHDR");
        assert_eq!(&m[LABELS as usize..LABELS as usize + 4], b"OHDR");
        assert!(m[(LABELS + DSET_LEN) as usize..].iter().all(|&b| b == 0));
    }

    #[test]
    fn rows_go_through_the_sieve_when_smaller() {
        // Measured (strace) on h5py's files: (64, 4096) rows 0 and 63, (4, 40960) row 3,
        // (2, 65536) row 1, (8, 131072) row 3.
        assert_eq!(plan(64, 4096, 0)[4], (2048, 65536));
        assert_eq!(plan(64, 4096, 63)[4], (260096, 4096));
        assert_eq!(plan(4, 40960, 3)[4], (124928, 40960));
        assert_eq!(plan(2, 65536, 1)[4], (67584, 65536));
        assert_eq!(plan(8, 131072, 3), [(0, 8), (0, 48), (48, 512), (179, 512), (395264, 131072)]);
    }
}
