"""`trainio record --layers nfs,file` on real NFS mounts (v4.1 and v3) in the QEMU guest,
and the same tracer binary's block and file layers on the guest's 6.1 kernel.

One boot runs every workload; the assertions run here on the traces it brings back.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from trainio_analysis.trace import SCHEMA_MINOR, read_metadata, scan_trace

ROOT = Path(__file__).resolve().parents[2]
RECORDER = ROOT / "target" / "release" / "trainio-record"
MiB = 1 << 20
MOUNTS = {"nfs41": ("/mnt/nfs41", "vers=4.1"), "nfs3": ("/mnt/nfs3", "vers=3")}
RPC_COLUMNS = ["rpc_xid", "rpc_backlog_ns", "rpc_rtt_ns", "rpc_execute_ns", "rpc_retrans"]
#: trace -> (mount point, NFS procedure in mountstats, nfs op in the trace)
RPC_TRACES = {
    "nfs41-read": ("/mnt/nfs41", "READ", "read"),
    "nfs3-read": ("/mnt/nfs3", "READ", "read"),
    "nfs41-write": ("/mnt/nfs41", "WRITE", "write"),
    "nfs3-write": ("/mnt/nfs3", "WRITE", "write"),
    "nfs41-buffered": ("/mnt/nfs41", "READ", "read"),
    "nc-read": ("/mnt/nc", "READ", "read"),
    "concurrent": ("/mnt/nfs41", "READ", "read"),
}

GUEST_SCRIPT = r"""
set -u
R=$PAYLOAD/trainio-record
rec() { name=$1; shift; mark step "$name"; "$R" -q -o "$OUT/$name" "$@" 2> "$OUT/$name.stderr"; echo $? > "$OUT/$name.rc"; }
for m in nfs41 nfs3; do
  f=/mnt/$m/data.bin
  rec $m-write --layers nfs,file -- dd if=/dev/urandom of=$f bs=64k count=128 oflag=direct
  rec $m-read --layers nfs,file -- dd if=$f of=/dev/null bs=64k iflag=direct
  sync; echo 3 > /proc/sys/vm/drop_caches
  rec $m-buffered --layers nfs,file -- dd if=$f of=/dev/null bs=1M
done
# A write made durable by fsync, then by fdatasync: the file layer's sync ops (schema 1.4).
rec nfs41-sync --layers nfs,file -- dd if=/dev/zero of=/mnt/nfs41/sync.bin bs=64k count=16 conv=fsync
rec nfs41-datasync --layers file -- dd if=/dev/zero of=/mnt/nfs41/sync.bin bs=64k count=16 conv=fdatasync
# nconnect=2 needs its own NFS client: vers=4.2 does not share vers=4.1's.
mkdir -p /mnt/nc && mount -t nfs -o vers=4.2,nconnect=2 127.0.0.1:/export /mnt/nc
rec nc-read --layers nfs -- dd if=/mnt/nc/data.bin of=/dev/null bs=64k count=64 iflag=direct
rec concurrent --layers nfs -- fio --name=c --filename=/mnt/nfs41/data.bin --direct=1 \
    --rw=randread --bs=64k --size=8M --numjobs=8 --iodepth=1 --ioengine=psync --io_size=4M \
    --randrepeat=0 --group_reporting --output=/dev/null
modprobe loop
truncate -s 128M $EXPORT/loop.img
L=$(losetup --find --show --direct-io=on $EXPORT/loop.img)
echo "$L" > $OUT/loopdev
stat -c '%t:%T' "$L" > $OUT/loopdev.majmin
rec loop -- dd if=$L of=/dev/null bs=1M count=64 iflag=direct
# Submit and reap whole batches: under TCG fio alone cannot keep 16 in flight.
for qd in 1 16; do
  rec loop-qd$qd --layers block --dev "$L" -- fio --name=q --filename=$L --direct=1 --rw=randread \
      --bs=4k --size=64M --io_size=8M --ioengine=libaio --iodepth=$qd --iodepth_batch_submit=$qd \
      --iodepth_batch_complete_min=$qd --norandommap --output=/dev/null
done
losetup -d "$L"
# How many NFS requests per second the layer records here without loss (TCG-bound).
rec rate --layers nfs -- fio --name=r --filename=/mnt/nfs41/data.bin --direct=1 --rw=randread \
    --bs=4k --size=8M --numjobs=4 --ioengine=psync --time_based --runtime=5 --output=/dev/null
"""


@pytest.fixture(scope="module")
def guest_run(nfs_guest):
    if not RECORDER.exists():
        pytest.fail(f"{RECORDER} is missing: run 'make' first")
    # ~65 s on 2 idle cores; a wedged boot is killed and retried (guest.WEDGE_STUCK_S).
    r = nfs_guest(GUEST_SCRIPT, files={"trainio-record": str(RECORDER)}, timeout=420)
    assert r.returncode == 0, r.stderr
    return r


def trace(r, name: str) -> Path:
    rc = (r.outdir / f"{name}.rc").read_text().strip()
    assert rc == "0", (r.outdir / f"{name}.stderr").read_text()
    return r.outdir / name


def nfs_rows(path: Path, op: str) -> pl.DataFrame:
    return scan_trace(path).filter((pl.col("layer") == "nfs") & (pl.col("op") == op)).collect()


def assert_covers_once(df: pl.DataFrame, size: int) -> None:
    df = df.sort("offset")
    starts, ends = df["offset"].to_list(), (df["offset"] + df["bytes"]).to_list()
    assert starts[0] == 0 and ends[-1] == size
    assert starts[1:] == ends[:-1], "each request starts where the previous ended"


def ambiguous(rows: pl.DataFrame) -> pl.Series:
    """True for rows whose (dev, file, offset, op) overlaps in time with another row's."""
    out = [False] * rows.height
    keyed = rows.with_row_index("i")
    for _, g in keyed.group_by(["dev", "offset", "op", "file"]):
        g = g.sort("issue_ns")
        latest_end, latest_i = None, None
        for i, issue, complete in zip(g["i"], g["issue_ns"], g["complete_ns"]):
            if latest_end is not None and issue < latest_end:
                out[i] = out[latest_i] = True
            if latest_end is None or complete > latest_end:
                latest_end, latest_i = complete, i
    return pl.Series(out)


def nfs_dev_of(path: Path, mount_point: str) -> tuple[str, str]:
    """(dev, mount options) of the mount point, from the trace's metadata."""
    for d in read_metadata(path)["devices"]:
        for m in d["mounts"]:
            if m["mount_point"] == mount_point:
                return d["dev"], m["options"]
    raise AssertionError(f"{mount_point} not in the metadata of {path}")


@pytest.mark.nfs
@pytest.mark.slow
@pytest.mark.parametrize("mount", sorted(MOUNTS))
def test_direct_write_then_read_is_recorded_exactly(guest_run, mount: str) -> None:
    point, vers = MOUNTS[mount]
    for kind, op in (("write", "write"), ("read", "read")):
        path = trace(guest_run, f"{mount}-{kind}")
        rows = nfs_rows(path, op)
        assert rows["bytes"].sum() == 8 * MiB
        # dd's read at EOF is a real READ RPC at offset 8 MiB that returns nothing.
        empty = rows.filter(pl.col("bytes") == 0)
        assert empty.height <= 1 and (empty["offset"] == 8 * MiB).all()
        data = rows.filter(pl.col("bytes") > 0)
        assert data.height == 128 and (data["bytes_requested"] == 64 * 1024).all()
        assert_covers_once(data, 8 * MiB)
        assert ((rows["complete_ns"] - rows["issue_ns"]) > 0).all()
        assert (rows["queue_depth"] >= 1).all()
        assert (rows["error"] == 0).all()
        dev, options = nfs_dev_of(path, point)
        assert rows["dev"].unique().to_list() == [dev], "every row is on the mount's s_dev"
        assert vers in options
        assert (rows["file"] == f"{point}/data.bin").all(), "fileid is named from the file layer's open"
        files = (
            scan_trace(path)
            .filter((pl.col("layer") == "file") & (pl.col("op") == op) & (pl.col("file") == f"{point}/data.bin"))
            .collect()
        )
        assert files["bytes"].sum() == 8 * MiB
        assert (files["bytes"] > 0).sum() == 128, "128 transfers of 64 KiB (a read at EOF returns 0)"
        assert (files["dev"] == dev).all()


@pytest.mark.nfs
@pytest.mark.slow
@pytest.mark.parametrize("mount", sorted(MOUNTS))
def test_buffered_read_after_drop_caches_is_seen_as_nfs_reads(guest_run, mount: str) -> None:
    path = trace(guest_run, f"{mount}-buffered")
    rows = nfs_rows(path, "read").sort("offset")
    assert rows.height >= 1
    covered = 0
    for off, n in zip(rows["offset"], rows["bytes"]):
        assert off <= covered, f"gap at {covered}"
        covered = max(covered, off + n)
    assert covered >= 8 * MiB


@pytest.mark.nfs
@pytest.mark.slow
def test_eight_concurrent_readers_raise_queue_depth_within_bounds(guest_run) -> None:
    rows = nfs_rows(trace(guest_run, "concurrent"), "read")
    assert rows["bytes"].sum() == 8 * 4 * MiB, "8 jobs x 4 MiB"
    assert rows["queue_depth"].max() > 1
    assert rows["queue_depth"].max() <= 8, "8 psync readers keep at most 8 READs outstanding"
    assert read_metadata(trace(guest_run, "concurrent"))["layers"] == ["nfs"]


@pytest.mark.nfs
@pytest.mark.slow
def test_block_and_file_layers_work_on_the_guest_kernel(guest_run) -> None:
    path = trace(guest_run, "loop")
    loopdev = (guest_run.outdir / "loopdev").read_text().strip()
    major, minor = (guest_run.outdir / "loopdev.majmin").read_text().strip().split(":")
    dev = f"{int(major, 16)}:{int(minor, 16)}"
    block = (
        scan_trace(path)
        .filter((pl.col("layer") == "block") & (pl.col("dev") == dev) & (pl.col("op") == "read"))
        .collect()
    )
    assert block["bytes"].sum() == 64 * MiB
    assert_covers_once(block, 64 * MiB)
    assert (block["queue_depth"] >= 1).all()
    reads = (
        scan_trace(path)
        .filter((pl.col("layer") == "file") & (pl.col("op") == "read") & (pl.col("file") == loopdev))
        .collect()
        .sort("issue_ns")
    )
    assert reads["offset"].to_list() == [i * MiB for i in range(64)]
    meta = read_metadata(path)
    assert meta["kernel_release"].startswith("6.1.")
    assert "nfs" in meta["layers"]


@pytest.mark.nfs
@pytest.mark.slow
def test_fio_queue_depth_bounds_on_the_guest_kernel(guest_run) -> None:
    qd1 = scan_trace(trace(guest_run, "loop-qd1")).filter(pl.col("op") == "read").collect()
    assert qd1.height >= 2048 and (qd1["queue_depth"] == 1).all()
    qd16 = scan_trace(trace(guest_run, "loop-qd16")).filter(pl.col("op") == "read").collect()["queue_depth"]
    assert qd16.len() >= 2048 and qd16.max() <= 16 and (qd16 > 1).mean() > 0.5


@pytest.mark.nfs
@pytest.mark.slow
def test_nfs_request_rate_recorded_without_loss(guest_run) -> None:
    path = trace(guest_run, "rate")
    meta = read_metadata(path)
    assert sum(meta["lost_events"].values()) == 0
    rows = nfs_rows(path, "read")
    seconds = (rows["complete_ns"].max() - rows["issue_ns"].min()) / 1e9
    rate = rows.height / seconds
    print(f"NFS READs recorded in the guest: {rows.height} in {seconds:.2f} s = {rate:,.0f}/s, 0 lost")
    assert rows.height > 1000


@pytest.mark.nfs
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RPC_TRACES))
def test_every_nfs_request_carries_its_rpc(guest_run, name: str) -> None:
    """rpc_stats_latency joined onto each READ/WRITE/COMMIT row, with values that fit it."""
    path = trace(guest_run, name)
    df = scan_trace(path).collect()
    nfs = df.filter(pl.col("layer") == "nfs")
    assert nfs.height > 0
    assert nfs["rpc_xid"].null_count() == 0, "every request was joined to its RPC"
    for col in RPC_COLUMNS:
        assert nfs[col].null_count() == 0, col
        assert df.filter(pl.col("layer") != "nfs")[col].null_count() == df.height - nfs.height, col
    latency = nfs["complete_ns"] - nfs["issue_ns"]
    assert (nfs["rpc_rtt_ns"] > 0).all(), "a READ/WRITE/COMMIT round trip takes > 1 us"
    # backlog (queued before transmit) and rtt are parts of execute, which the nfs
    # initiate -> done interval encloses (the RPC task starts after nfs_initiate_*).
    assert (nfs["rpc_rtt_ns"] <= nfs["rpc_execute_ns"]).all()
    assert (nfs["rpc_backlog_ns"] <= nfs["rpc_execute_ns"]).all()
    # Only where the pairing is unambiguous: two requests for the same range in flight at
    # once (concurrent readers) may have their issue times swapped.
    alone = ~ambiguous(nfs)
    assert alone.sum() > nfs.height // 2
    assert (nfs.filter(alone)["rpc_execute_ns"] <= latency.filter(alone)).all()
    assert (nfs["rpc_retrans"] == 0).all(), "loopback: nothing is retransmitted"
    for dev, rows in nfs.group_by("dev"):
        assert rows["rpc_xid"].n_unique() == rows.height, f"{dev}: one RPC per request"


def _mount_entry(meta: dict, point: str) -> dict:
    entries = [m for m in meta["nfs_mounts"] if m["mount_point"] == point]
    assert len(entries) == 1, meta["nfs_mounts"]
    return entries[0]


@pytest.mark.nfs
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RPC_TRACES))
def test_mountstats_counters_agree_with_the_joined_rows(guest_run, name: str) -> None:
    """The kernel's own per-op totals over the recording equal the rows' RPC fields summed:
    the join took each RPC once, and took the right one."""
    point, proc, op = RPC_TRACES[name]
    path = trace(guest_run, name)
    meta = read_metadata(path)
    m = _mount_entry(meta, point)
    assert sum(meta["lost_events"].values()) == 0, meta["lost_events"]
    rows = nfs_rows(path, op)
    assert rows["dev"].unique().to_list() == [m["dev"]], "mountstats joined to the mount's dev"
    assert m["fstype"].startswith("nfs") and m["source"] == "127.0.0.1:/export"
    start, close = m["at_start"], m["at_close"]
    assert close["age_s"] >= start["age_s"]
    before, after = start["ops"].get(proc, {}), close["ops"][proc]
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta["ops"] == rows.height, (
        f"{proc} RPCs during the recording = {op} rows",
        delta,
        rows.height,
        rows["rpc_xid"].n_unique(),
        rows.filter(ambiguous(rows)).height,
    )
    assert delta["trans"] == (rows["rpc_retrans"] + 1).sum(), "transmissions counted per xid"
    payload = delta["bytes_recv"] if op == "read" else delta["bytes_sent"]
    assert payload >= rows["bytes"].sum(), "RPC bytes include the data"
    # mountstats sums nanoseconds and prints milliseconds; the rows have microseconds.
    for col, key in (("rpc_rtt_ns", "rtt_ms"), ("rpc_execute_ns", "execute_ms"), ("rpc_backlog_ns", "queue_ms")):
        tolerance = 1_000_000 + rows.height * 1000
        assert abs(rows[col].sum() - delta[key] * 1_000_000) <= tolerance, (col, rows[col].sum(), delta[key])


@pytest.mark.nfs
@pytest.mark.slow
def test_nfs_mounts_metadata_has_options_and_transports(guest_run) -> None:
    meta = read_metadata(trace(guest_run, "nc-read"))
    nc = _mount_entry(meta, "/mnt/nc")
    assert nc["nconnect"] == 2 and "nconnect=2" in nc["opts"] and "vers=4.2" in nc["opts"]
    assert [x["proto"] for x in nc["at_close"]["xprts"]] == ["tcp", "tcp"]
    assert sum(x["counters"]["sends"] for x in nc["at_close"]["xprts"]) > 0
    v3 = _mount_entry(meta, "/mnt/nfs3")
    assert v3["nconnect"] == 1 and "vers=3" in v3["opts"] and len(v3["at_close"]["xprts"]) == 1
    assert v3["dev"] == guest_run.mount("/mnt/nfs3")["dev"]
    assert meta["schema_minor"] == SCHEMA_MINOR
    # without the nfs layer there is nothing to say about NFS mounts
    assert read_metadata(trace(guest_run, "loop-qd1"))["nfs_mounts"] == []


@pytest.mark.nfs
@pytest.mark.slow
@pytest.mark.parametrize(("name", "op"), [("nfs41-sync", "fsync"), ("nfs41-datasync", "fdatasync")])
def test_syncs_are_file_rows_on_the_guest_kernel(guest_run, name: str, op: str) -> None:
    # The sync probes load and fire on 6.1: dd's one sync of the file it wrote, after its
    # 16 writes, with no bytes of its own.
    df = scan_trace(trace(guest_run, name)).filter(pl.col("layer") == "file").collect().sort("issue_ns")
    mine = df.filter(pl.col("file") == "/mnt/nfs41/sync.bin")
    writes = mine.filter(pl.col("op") == "write")
    syncs = mine.filter(pl.col("op") == op)
    assert writes.height == 16 and writes["bytes"].sum() == MiB
    assert syncs.height == 1 and syncs["bytes"][0] == 0 and syncs["error"][0] == 0
    assert syncs["issue_ns"][0] >= writes["complete_ns"].max()
