"""datagen writes valid files of the formats trainio lays out: the real readers open them
(numpy for npz and npy, a check of TensorFlow's framing for tfrecord)."""

from __future__ import annotations

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
