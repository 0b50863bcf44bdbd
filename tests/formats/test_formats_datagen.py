"""datagen writes valid files of the formats trainio lays out: the real readers open them
(numpy for npz and npy, h5py for hdf5, a check of TensorFlow's framing for tfrecord,
pyarrow, polars and duckdb for parquet, PIL and torchvision for jpeg)."""

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
    files = _datagen(tmpfs_dir, "png", files=2, spf=1, record=5000)
    assert [f.stat().st_size for f in files] == [8192, 8192]


# DLIO's column spec (dataset.parquet.columns), every numeric dtype trainio writes.
PARQUET_COLUMNS = """    columns:
      - {name: label, dtype: float32, size: 1, read: true}
      - {name: dense, dtype: float32, size: 128, read: true}
      - {name: aux, dtype: float64, size: 40, read: false}
      - {name: cat, dtype: int8, size: 1}
      - {name: half, dtype: float16, size: 3}
      - {name: ids, dtype: uint16, size: 2}
      - {name: big, dtype: int64, size: 1}
"""


def _parquet_workload(tmp: Path, compression: str) -> Path:
    wl = write_workload(tmp / f"pq-{compression}.yaml", fmt="parquet", files=2, spf=250, record=1)
    text = wl.read_text().replace(
        "dataset:\n",
        f"dataset:\n  compression: {compression}\n  parquet:\n    row_group_size: 100\n{PARQUET_COLUMNS}",
        1,
    )
    wl.write_text(text.replace("  record_length_bytes: 1\n", ""))
    return wl


def test_parquet_is_read_by_pyarrow_polars_and_duckdb(tmpfs_dir: Path) -> None:
    """The files hold the workload's columns, dtypes, sizes and row groups, in the codec it
    names; pyarrow, polars and duckdb read every row."""
    import duckdb
    import polars as pl
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for codec in ("none", "snappy", "gzip"):
        tmp = tmpfs_dir / codec
        tmp.mkdir()
        wl = _parquet_workload(tmp, codec)
        data = tmp / "data"
        trainio("datagen", "--workload", wl, "--data-dir", data, "--gpus", 1, "-q")
        files = sorted((data / "train").iterdir())
        assert [f.suffix for f in files] == [".parquet"] * 2
        for f in files:
            pf = pq.ParquetFile(f)
            meta = pf.metadata
            assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [100, 100, 50]
            assert meta.row_group(0).column(0).compression == {"none": "UNCOMPRESSED"}.get(codec, codec.upper())
            table = pf.read()
            assert table.num_rows == 250
            schema = table.schema
            assert schema.field("label").type == pa.float32()
            assert schema.field("dense").type.value_type == pa.float32()
            assert schema.field("aux").type.value_type == pa.float64()
            assert schema.field("cat").type == pa.int8()
            assert schema.field("half").type.value_type == pa.float16()
            assert schema.field("ids").type.value_type == pa.uint16()
            assert schema.field("big").type == pa.int64()
            lengths = {c: set(pc.list_value_length(table[c]).to_pylist()) for c in ("dense", "aux", "ids")}
            assert lengths == {"dense": {128}, "aux": {40}, "ids": {2}}
            assert len(set(table["label"].to_pylist())) > 200, "values must vary"
            df = pl.read_parquet(f)
            assert df.height == 250 and df["dense"].list.len().unique().to_list() == [128]
        rows, cats, dense = duckdb.sql(
            f"select count(*), count(distinct cat), sum(len(dense)) from read_parquet('{data}/train/*.parquet')"
        ).fetchall()[0]
        assert (rows, dense) == (500, 500 * 128) and cats > 100, (rows, cats, dense)


def test_parquet_keys_trainio_does_not_write_are_refused(tmpfs_dir: Path) -> None:
    """A dtype, codec or read mode datagen does not write is refused in one line naming
    the key, exit 2, before anything is written."""
    wl = _parquet_workload(tmpfs_dir, "snappy")
    text = wl.read_text()
    data = tmpfs_dir / "data"
    for old, new, says in [
        ("dtype: int64", "dtype: string", "dataset.parquet.columns[6].dtype: 'string'"),
        ("compression: snappy", "compression: lzo", "dataset.compression: 'lzo'"),
        ("row_group_size: 100", "row_group_size: 100\n    read_mode: mmap", "dataset.parquet.read_mode"),
    ]:
        wl.write_text(text.replace(old, new, 1))
        p = run([str(TRAINIO), "datagen", "--workload", str(wl), "--data-dir", str(data), "--gpus", "1", "-q"])
        err = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(err) == 1 and says in err[0], (new, p.returncode, p.stderr)
        assert not data.exists(), "nothing is written"


def test_jpeg_images_open_in_pil_and_torchvision(tmpfs_dir: Path) -> None:
    """JPEG files of the record length (± its stdev, rounded up to 4 KiB) that PIL decodes
    and torchvision's ImageFolder loader opens; the images differ."""
    from PIL import Image
    from torchvision.datasets.folder import pil_loader

    wl = write_workload(tmpfs_dir / "j.yaml", fmt="jpeg", files=6, spf=1, record=322957)
    stdev = "  record_length_bytes: 322957\n  record_length_bytes_stdev: 30000\n"
    wl.write_text(wl.read_text().replace("  record_length_bytes: 322957\n", stdev))
    data = tmpfs_dir / "data"
    trainio("datagen", "--workload", wl, "--data-dir", data, "--gpus", 1, "-q")
    files = sorted((data / "train").iterdir())
    assert [f.suffix for f in files] == [".jpeg"] * 6
    sizes = [f.stat().st_size for f in files]
    assert len(set(sizes)) > 1 and all(s % 4096 == 0 and 200_000 < s < 450_000 for s in sizes), sizes
    pixels = []
    for f in files:
        with Image.open(f) as im:
            assert im.format == "JPEG" and im.mode == "L"
            x = np.asarray(im)
        assert x.shape[1] == 512 and x.std() > 10, (x.shape, x.std())
        pixels.append(x[:8].tobytes())
        assert pil_loader(str(f)).mode == "RGB"
    assert len(set(pixels)) == 6, "images must differ"


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
