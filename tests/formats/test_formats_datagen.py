"""datagen writes valid files of the formats trainio lays out: the real readers open them
(numpy for npz and npy, a check of TensorFlow's framing for tfrecord)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from formats_testlib import tfrecords, trainio, write_workload


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


def test_other_formats_are_opaque_files(tmpfs_dir: Path) -> None:
    files = _datagen(tmpfs_dir, "jpeg", files=2, spf=1, record=5000)
    assert [f.stat().st_size for f in files] == [8192, 8192]


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
