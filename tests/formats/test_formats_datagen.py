"""datagen writes valid files of the formats trainio lays out: the real readers open them
(numpy for npz and npy, h5py for hdf5, a check of TensorFlow's framing for tfrecord)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
from formats_testlib import tfrecords, trainio, write_workload

from trainio_testlib import TRAINIO, run


def _datagen(tmp: Path, fmt: str, **kw) -> list[Path]:
    wl = write_workload(tmp / f"{fmt}.yaml", fmt=fmt, **kw)
    data = tmp / "data"
    trainio("datagen", "--workload", wl, "--data-dir", data, "--gpus", 1, "-q")
    return sorted((data / "train").iterdir())


def test_npz_is_what_numpy_savez_writes(tmpfs_dir: Path) -> None:
    files = _datagen(tmpfs_dir, "npz", files=3, spf=2, record=10000)
    assert [f.suffix for f in files] == [".npz"] * 3
    for f in files:
        with np.load(f) as npz:
            assert npz.files == ["x"]
            x = npz["x"]
        # two samples of 10000 bytes rounded up to 4 KiB
        assert x.shape == (2, 12288) and x.dtype == np.uint8
        assert len(np.unique(x)) > 200, "payload must not be constant"
        again = tmpfs_dir / "again.npz"
        np.savez(again, x=x)
        assert again.read_bytes() == f.read_bytes(), f"{f}: differs from numpy.savez of its own array"
    first = np.load(files[0])["x"]
    assert not np.array_equal(first, np.load(files[1])["x"]), "files must differ (stamped)"


def test_npy_is_what_numpy_save_writes(tmpfs_dir: Path) -> None:
    files = _datagen(tmpfs_dir, "npy", files=2, spf=3, record=5000)
    for f in files:
        x = np.load(f)
        assert x.shape == (3, 8192) and x.dtype == np.uint8
        again = tmpfs_dir / "again.npy"
        np.save(again, x)
        assert again.read_bytes() == f.read_bytes()


def test_tfrecord_framing_is_valid(tmpfs_dir: Path) -> None:
    files = _datagen(tmpfs_dir, "tfrecord", files=2, spf=5, record=3000)
    for f in files:
        assert f.suffix == ".tfrecord"
        records = tfrecords(f)
        assert [len(r) for r in records] == [4096] * 5
        assert len(set(records)) == 5, "records must differ"


def test_hdf5_is_what_h5py_writes(tmpfs_dir: Path) -> None:
    """h5py opens datagen's hdf5 files, row k of records_0 is sample k where the replay
    reads it (after the 2048-byte metadata block), and h5py writing the same arrays as
    DLIO's generator does (libver='latest', records_0 then labels) makes the same bytes."""
    spf, sample = 4, 12288  # 10000 bytes rounded up to 4 KiB
    files = _datagen(tmpfs_dir, "hdf5", files=2, spf=spf, record=10000)
    assert [f.suffix for f in files] == [".hdf5"] * 2
    for i, f in enumerate(files):
        rows = []
        raw = f.read_bytes()
        assert len(raw) == 2048 + spf * sample + 8 * spf
        with h5py.File(f, "r") as h:
            assert sorted(h.keys()) == ["labels", "records_0"]
            assert h["records_0"].shape == (spf, sample) and h["records_0"].dtype == np.uint8
            assert h["records_0"].chunks is None, "contiguous, as DLIO writes without chunk_dims"
            assert h["labels"].dtype == np.int64 and list(h["labels"][()]) == [0] * spf
            for k in range(spf):
                row = h["records_0"][k]
                at = 2048 + k * sample
                assert row.tobytes() == raw[at : at + sample], f"{f}: row {k} is not at {at}"
                rows.append(row.tobytes())
            x = h["records_0"][()]
        # The payload's stamp: file index and MiB index in the first 16 bytes.
        assert raw[2048 : 2048 + 16] == i.to_bytes(8, "little") + bytes(8)
        again = tmpfs_dir / "again.hdf5"
        with h5py.File(again, "w", libver="latest") as h:
            h.create_dataset("records_0", data=x)
            h.create_dataset("labels", data=[0] * spf)
        assert again.read_bytes() == raw, f"{f}: differs from h5py's file of its own arrays"
        assert len(set(rows)) == spf, "a file's samples must differ"


def test_chunked_hdf5_is_what_h5py_writes(tmpfs_dir: Path) -> None:
    """With dataset.chunk_dims, records_0 is chunked along the samples (chunk_dims[0] rows
    a chunk) and the file is byte for byte h5py's for create_dataset(..., chunks=(c0,
    sample)) of the same arrays: an edge chunk past the last row (8 rows in 3s), a
    3-byte chunk dim encoding (131072-byte rows), and the most chunks whose index fits
    in the metadata block (160). Without chunk_dims the file would be contiguous, and
    none of these would match."""
    for spf, record, dims in [(8, 4096, [3, 64, 64]), (4, 131072, [2, 256, 512]), (160, 4096, [1, 64, 64])]:
        tmp = tmpfs_dir / f"c{spf}"
        tmp.mkdir()
        wl = write_workload(tmp / "h.yaml", fmt="hdf5", files=1, spf=spf, record=record)
        wl.write_text(wl.read_text().replace("dataset:\n", f"dataset:\n  chunk_dims: {dims}\n", 1))
        p = trainio("datagen", "--workload", wl, "--data-dir", tmp / "data", "--gpus", 1, "-q")
        assert "chunk_dims" not in p.stderr, p.stderr
        [f] = sorted((tmp / "data" / "train").iterdir())
        raw = f.read_bytes()
        with h5py.File(f, "r") as h:
            assert h["records_0"].chunks == (dims[0], record), f
            assert h["records_0"].shape == (spf, record)
            x = h["records_0"][()]
            for k in (0, spf - 1):
                assert h["records_0"][k].tobytes() == raw[2048 + k * record : 2048 + (k + 1) * record], (f, k)
        assert len({x[k].tobytes() for k in range(spf)}) == spf, "a file's samples must differ"
        again = tmp / "again.hdf5"
        with h5py.File(again, "w", libver="latest") as h:
            h.create_dataset("records_0", data=x, chunks=(dims[0], record))
            h.create_dataset("labels", data=[0] * spf)
        assert again.read_bytes() == raw, f"{f}: differs from h5py's chunked file of its own arrays"


def test_other_formats_are_opaque_files(tmpfs_dir: Path) -> None:
    files = _datagen(tmpfs_dir, "jpeg", files=2, spf=1, record=5000)
    assert [f.stat().st_size for f in files] == [8192, 8192]


def test_hdf5_with_odirect_is_refused(tmpfs_dir: Path) -> None:
    """h5py reads through the page cache (DLIO raises for reader.odirect with hdf5): the
    workload's reader.odirect and --odirect are refused in one line, exit 2, before
    anything is written."""
    wl = write_workload(tmpfs_dir / "o.yaml", fmt="hdf5", files=2, spf=2, record=8192, extra="  odirect: true\n")
    plain = write_workload(tmpfs_dir / "p.yaml", fmt="hdf5", files=2, spf=2, record=8192)
    data = tmpfs_dir / "data"
    for args, says in [
        (["--workload", wl], f"{wl}: reader.odirect: true: O_DIRECT is not supported with dataset.format hdf5"),
        (["--workload", plain, "--odirect"], "--odirect: O_DIRECT is not supported with dataset.format hdf5"),
    ]:
        p = run([str(TRAINIO), "replay", *map(str, args), "--data-dir", str(data), "--generate", "-q"])
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        err = p.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"trainio replay: {says}"), p.stderr
        assert not data.exists(), "nothing is written"


def test_indexed_binary_index_files_say_where_the_samples_are(tmpfs_dir: Path) -> None:
    """DLIO's layout: per data file, the samples back to back and FILE.off.idx and
    FILE.sz.idx holding each sample's offset and size as u64; DLIO's listing (names
    ending with the format) finds the data files only; the marker counts the index files."""
    for fmt in ("indexed_binary", "mmap_indexed_binary"):
        tmp = tmpfs_dir / fmt
        tmp.mkdir()
        files = _datagen(tmp, fmt, files=3, spf=5, record=10000)
        data = [f for f in files if f.name.endswith(fmt)]
        assert len(data) == 3 and len(files) == 9, [f.name for f in files]
        for f in data:
            offsets = np.fromfile(f"{f}.off.idx", dtype="<u8")
            sizes = np.fromfile(f"{f}.sz.idx", dtype="<u8")
            # five samples of 10000 bytes rounded up to 4 KiB, back to back
            assert sizes.tolist() == [12288] * 5
            assert offsets.tolist() == [k * 12288 for k in range(5)]
            raw = f.read_bytes()
            assert len(raw) == int(offsets[-1] + sizes[-1])
            samples = [raw[o : o + s] for o, s in zip(offsets.tolist(), sizes.tolist())]
            assert b"".join(samples) == raw
            assert len(set(samples)) == 5, "samples must differ"
        marker = json.loads((tmp / "data" / ".trainio-dataset").read_text())
        assert marker["bytes"] == 3 * (5 * 12288 + 2 * 5 * 8)
