"""A real PyTorch training job, written as a user writes one, for the tests and benchmarks.

Each rank reads sample files through a `torch.utils.data.DataLoader` (a `Dataset` of one
sample per file, a `DistributedSampler`, W worker processes), stands in for the
accelerator with a sleep of --compute-ms per step, and synchronizes gradients with an
all_reduce after every step, as DDP does. torchrun launches the ranks (gloo, CPU); run
without torchrun it is a single process.

    torchrun --standalone --nproc-per-node=2 tests/realjob/job.py --data DIR --format npz \\
        --batch-size 4 --num-workers 2 --compute-ms 50 --out job.json

Formats: `npz` (one uncompressed `np.savez` array `x` per file, read with `np.load`),
`raw` (plain bytes, read with open()+read(); with --odirect opened O_DIRECT and read with
os.preadv into a page-aligned buffer, so file sizes are multiples of 4096). And the loaders
people run, each as its library reads:

- `arrow`: a HuggingFace `datasets` dataset saved with `save_to_disk` (a binary column
  `x`), opened with `datasets.load_from_disk`: Arrow files memory-mapped, a sample read
  by indexing the dataset, i.e. through page faults;
- `wds`: WebDataset tar shards (`shard-NNNNNN.tar`, one member `KEY.x` per sample) read by
  `webdataset.WebDataset` with `split_by_node` and `split_by_worker`, streamed, and
  batched inside the workers (`.batched(batch)`; the DataLoader takes whole batches);
- `jpeg`: an ImageFolder tree (`class/NNNNNN.jpg`) read by torchvision's `ImageFolder`,
  each image opened and decoded by PIL and made a tensor in the workers;
- `s3`: objects from S3, `--data BUCKET/PREFIX` (one sample per object under the prefix,
  listed once), read with boto3's `get_object` in the workers, each worker with its own
  client: the whole object, or with --s3-part N odd-numbered samples in ranged GETs of
  N bytes, one after the other. Endpoint and keys from AWS_ENDPOINT_URL,
  AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; plain HTTP, path-style.

With --checkpoint-every N, every rank saves a checkpoint after each N-th step of an epoch,
as a training script does: `torch.save` of a state of --checkpoint-mib MiB (a model's
tensor and an optimizer's, half each) to --checkpoint-dir/rank<R>-step<S>.pt, then fsync.
The save stands between the step and the next batch; its time is the rank's, counted in
neither compute nor waiting for data. With --checkpoint-s3 BUCKET/PREFIX the checkpoint
goes to S3 instead, as boto3 puts one: the training state's `torch.save` bytes as
PREFIX/rank<R>-step<S>.pt with `upload_fileobj` (a multipart upload of 5 MiB parts, two
in flight, above 5 MiB), and a small `torch.save` of the step and RNG state as
PREFIX/rank<R>-step<S>.meta with one `put_object`.

Rank 0 writes one JSON file (atomically: temp file, then rename) with each rank's figures
and the job's, measured as DLIO measures (REFERENCE.md §3): per step, the wait for the
batch and the measured sleep; per rank, AU = Σ compute of steps 2..n / (elapsed − step 1),
throughput = the samples of steps 2..n over the same time; the job's throughput is the sum
over ranks and its AU the mean. With several epochs, each epoch's first step is left out.
Timestamps are CLOCK_MONOTONIC ns (time.monotonic_ns()), the clock of the traces.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SEED = 1234
SUFFIX = {"npz": ".npz", "raw": ".raw"}
LOADERS = ("arrow", "wds", "jpeg", "s3")  # read by their libraries (module doc)
ALIGN = 4096


def s3_client():
    """A boto3 client of the endpoint in AWS_ENDPOINT_URL (credentials from the
    environment): path-style, one attempt, checksums only where required."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=os.environ["AWS_ENDPOINT_URL"],
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


class SampleFiles(Dataset):
    """One sample per file of `data` with the format's suffix, in sorted order. An item is
    (the sample as a uint8 tensor, the file's size in bytes)."""

    def __init__(self, data: Path, fmt: str, odirect: bool) -> None:
        self.paths = sorted(str(p) for p in data.iterdir() if p.name.endswith(SUFFIX[fmt]))
        if not self.paths:
            raise SystemExit(f"job: no {SUFFIX[fmt]} files in {data}")
        self.fmt = fmt
        self.odirect = odirect

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path = self.paths[i]
        if self.fmt == "npz":
            with np.load(path) as z:
                x = z["x"]
            return torch.from_numpy(x), os.path.getsize(path)
        if self.odirect:
            data = read_odirect(path)
        else:
            with open(path, "rb") as f:
                data = f.read()
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), len(data)


class ArrowRows(Dataset):
    """Rows of a HuggingFace dataset saved with save_to_disk: (column `x` as a uint8
    tensor, its length). load_from_disk memory-maps the Arrow files; indexing reads a row
    through the mapping."""

    def __init__(self, data: Path) -> None:
        import datasets

        self.ds = datasets.load_from_disk(str(data))

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = self.ds[i]["x"]
        return torch.frombuffer(bytearray(x), dtype=torch.uint8), len(x)


class S3Objects(Dataset):
    """The objects under BUCKET/PREFIX (`data`), in key order; an item is (the object's
    bytes as a uint8 tensor, the bytes fetched). Each process that indexes it makes its own
    boto3 client (a client is not to be shared across fork)."""

    def __init__(self, data: Path, part: int) -> None:
        self.bucket, _, prefix = str(data).partition("/")
        self.part = part
        self.client_pid: int | None = None
        pages = self._client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        found = sorted((o["Key"], o["Size"]) for page in pages for o in page.get("Contents", []))
        if not found:
            raise SystemExit(f"job: no objects under s3://{data}")
        self.keys = [k for k, _ in found]
        self.sizes = [n for _, n in found]

    def _client(self):
        if self.client_pid != os.getpid():
            self.s3 = s3_client()
            self.client_pid = os.getpid()
        return self.s3

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        s3, key = self._client(), self.keys[i]
        if self.part and i % 2 == 1:
            parts = []
            for at in range(0, self.sizes[i], self.part):
                last = min(at + self.part, self.sizes[i]) - 1
                parts.append(s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={at}-{last}")["Body"].read())
            data = b"".join(parts)
        else:
            data = s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), len(data)


def jpeg_dataset(data: Path) -> Dataset:
    """torchvision's ImageFolder over `data`, an item (the decoded image as a tensor, the
    file's size in bytes)."""
    from torchvision import datasets as tv_datasets
    from torchvision.transforms import functional as tvf

    class Images(tv_datasets.ImageFolder):
        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            path, _label = self.samples[i]
            img = self.loader(path)  # PIL: open, then decode on first use
            return tvf.pil_to_tensor(img), os.path.getsize(path)

    return Images(str(data))


def shard_paths(data: Path) -> list[str]:
    paths = sorted(str(p) for p in data.iterdir() if p.name.endswith(".tar"))
    if not paths:
        raise SystemExit(f"job: no .tar shards in {data}")
    return paths


def wds_pipeline(data: Path, batch: int):
    """WebDataset over the shards of `data`: each rank takes shards[rank::world], each
    worker shards[w::W] of those, and batches `batch` samples (x as uint8 tensors, and
    their sizes) inside the worker."""
    import webdataset as wds

    def sample(s: dict) -> tuple[torch.Tensor, int]:
        x = s["x"]
        return torch.frombuffer(bytearray(x), dtype=torch.uint8), len(x)

    return (
        wds.WebDataset(
            shard_paths(data),
            shardshuffle=False,
            nodesplitter=wds.split_by_node,
            workersplitter=wds.split_by_worker,
            empty_check=False,
        )
        .map(sample)
        .batched(batch, partial=False)
    )


def read_odirect(path: str) -> bytes:
    """The whole file, read with O_DIRECT into a page-aligned anonymous mapping."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        size = os.fstat(fd).st_size
        if size % ALIGN:
            raise ValueError(f"{path}: {size} bytes is not a multiple of {ALIGN} (O_DIRECT)")
        buf = mmap.mmap(-1, max(size, ALIGN))
        try:
            done = 0
            while done < size:
                n = os.preadv(fd, [memoryview(buf)[done:size]], done)
                if n <= 0:
                    raise OSError(f"{path}: short read at {done} of {size}")
                done += n
            return buf[:size]
        finally:
            buf.close()
    finally:
        os.close(fd)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="directory of sample files")
    ap.add_argument("--format", choices=sorted((*SUFFIX, *LOADERS)), default="npz")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--compute-ms", type=float, default=50.0, help="the accelerator's time per step")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--steps", type=int, default=None, help="at most this many steps per epoch")
    ap.add_argument("--odirect", action="store_true", help="raw format: read with O_DIRECT")
    ap.add_argument(
        "--s3-part", type=int, default=0, metavar="N", help="s3 format: odd samples in ranged GETs of N bytes"
    )
    ap.add_argument("--out", type=Path, required=True, help="the job's JSON (written by rank 0)")
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="N",
        help="save a checkpoint after every N-th step of an epoch (0: never)",
    )
    ap.add_argument("--checkpoint-dir", type=Path, help="where the checkpoints go")
    ap.add_argument("--checkpoint-s3", metavar="BUCKET/PREFIX", help="where the checkpoints go, in S3")
    ap.add_argument("--checkpoint-mib", type=float, default=8.0, help="MiB of state per rank")
    args = ap.parse_args(argv)
    if args.odirect and args.format != "raw":
        ap.error("--odirect reads raw files only")
    if args.s3_part < 0 or (args.s3_part and args.format != "s3"):
        ap.error("--s3-part N needs N >= 0 and --format s3")
    if args.checkpoint_every < 0 or (
        args.checkpoint_every and (args.checkpoint_dir is None) == (not args.checkpoint_s3)
    ):
        ap.error("--checkpoint-every N needs N >= 0 and one of --checkpoint-dir and --checkpoint-s3")
    return args


def save_checkpoint(state: dict, path: Path) -> dict:
    """torch.save to `path`, then fsync: the checkpoint is on storage when this returns."""
    t0 = time.monotonic_ns()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    return {"path": str(path), "bytes": path.stat().st_size, "start_ns": t0, "end_ns": time.monotonic_ns()}


MULTIPART_CHUNK = 5 << 20  # boto3's part size here (S3's least), and its threshold


def save_checkpoint_s3(state: dict, meta: dict, where: str, name: str) -> dict:
    """The checkpoint as objects of `where` (BUCKET/PREFIX): the state with upload_fileobj
    (multipart above 5 MiB: 5 MiB parts, two at once), the meta with one put_object."""
    import io

    from boto3.s3.transfer import TransferConfig

    bucket, _, prefix = where.partition("/")
    s3 = s3_client()
    t0 = time.monotonic_ns()
    body, small = io.BytesIO(), io.BytesIO()
    torch.save(state, body)
    torch.save(meta, small)
    big_key, small_key = f"{prefix}/{name}.pt".lstrip("/"), f"{prefix}/{name}.meta".lstrip("/")
    size = body.tell()
    body.seek(0)
    config = TransferConfig(
        multipart_threshold=MULTIPART_CHUNK, multipart_chunksize=MULTIPART_CHUNK, max_concurrency=2, use_threads=True
    )
    s3.upload_fileobj(body, bucket, big_key, Config=config)
    s3.put_object(Bucket=bucket, Key=small_key, Body=small.getvalue())
    parts = -(-size // MULTIPART_CHUNK) if size > MULTIPART_CHUNK else 0
    return {
        "objects": [
            {"key": f"{bucket}/{big_key}", "bytes": size, "parts": parts},
            {"key": f"{bucket}/{small_key}", "bytes": len(small.getvalue()), "parts": 0},
        ],
        "bytes": size + len(small.getvalue()),
        "start_ns": t0,
        "end_ns": time.monotonic_ns(),
    }


def train(args: argparse.Namespace, rank: int, world: int) -> dict:
    """The training loop of one rank; returns its figures."""
    sampler = None
    if args.format == "wds":
        # Batches are made in the workers: the DataLoader passes them on as they come.
        loader = DataLoader(wds_pipeline(args.data, args.batch_size), batch_size=None, num_workers=args.num_workers)
    else:
        if args.format == "arrow":
            dataset: Dataset = ArrowRows(args.data)
        elif args.format == "jpeg":
            dataset = jpeg_dataset(args.data)
        elif args.format == "s3":
            dataset = S3Objects(args.data, args.s3_part)
        else:
            dataset = SampleFiles(args.data, args.format, args.odirect)
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=SEED, drop_last=True)
        loader = DataLoader(
            dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers, persistent_workers=False
        )
    compute_s = args.compute_ms / 1000.0
    grad = torch.zeros(1)
    checkpoints: list[dict] = []
    if args.checkpoint_every:
        half = int(args.checkpoint_mib * 2**20) // 8  # float32 elements in half the state
        gen = torch.Generator().manual_seed(SEED + rank)
        state = {"model": torch.rand(half, generator=gen), "optimizer": torch.rand(half, generator=gen)}
        if args.checkpoint_dir is not None:
            args.checkpoint_dir.mkdir(parents=True, exist_ok=True)

    steps = samples = bytes_read = 0
    timed_samples = timed_bytes = 0  # steps 2..n of each epoch
    timed_compute = timed_wait = timed_span = timed_sync = 0.0
    first_ns = last_ns = None
    waits: list[float] = []  # every step's wait for its batch, s
    syncs: list[float] = []  # every step's all_reduce, s
    ends: list[int] = []  # every step's end, CLOCK_MONOTONIC ns
    start = time.monotonic_ns()
    for epoch in range(args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        it = iter(loader)
        epoch_start = prev_end = time.monotonic_ns()
        if first_ns is None:
            first_ns = epoch_start
        step_one_end = None
        n = 0
        while args.steps is None or n < args.steps:
            t0 = time.monotonic_ns()
            try:
                x, sizes = next(it)
            except StopIteration:
                break
            t1 = time.monotonic_ns()
            c0 = time.perf_counter()
            time.sleep(compute_s)
            slept = time.perf_counter() - c0
            s0 = time.perf_counter()
            if world > 1:
                dist.all_reduce(grad)
            synced = time.perf_counter() - s0
            n += 1
            if args.checkpoint_every and n % args.checkpoint_every == 0 and args.checkpoint_s3:
                meta = {"epoch": epoch, "step": n, "rng": torch.get_rng_state()}
                saved = save_checkpoint_s3(state, meta, args.checkpoint_s3, f"rank{rank}-step{n}")
                checkpoints.append({"epoch": epoch, "step": n, **saved})
            elif args.checkpoint_every and n % args.checkpoint_every == 0:
                path = args.checkpoint_dir / f"rank{rank}-step{n}.pt"
                checkpoints.append({"epoch": epoch, "step": n, **save_checkpoint(state, path)})
            end = time.monotonic_ns()
            waits.append((t1 - t0) / 1e9)
            syncs.append(synced)
            ends.append(end)
            nbytes = int(sizes.sum())
            samples += len(x)
            bytes_read += nbytes
            if n == 1:
                step_one_end = end
            else:
                timed_samples += len(x)
                timed_bytes += nbytes
                timed_compute += slept
                timed_sync += synced
                timed_wait += (t1 - t0) / 1e9
            prev_end = end
        del it  # shuts this epoch's workers down
        steps += n
        if step_one_end is not None:
            timed_span += (prev_end - step_one_end) / 1e9
        last_ns = prev_end
    wall = (time.monotonic_ns() - start) / 1e9
    rate = timed_samples / timed_span if timed_span > 0 else 0.0
    return {
        "rank": rank,
        "steps": steps,
        "samples": samples,
        "bytes_read": bytes_read,
        "wall_s": wall,
        "compute_s": timed_compute,
        "io_wait_s": timed_wait,
        "sync_s": timed_sync,
        "timed_s": timed_span,
        "au": timed_compute / timed_span if timed_span > 0 else 0.0,
        "samples_per_s": rate,
        "mib_per_s": timed_bytes / timed_span / 2**20 if timed_span > 0 else 0.0,
        "first_step_ns": first_ns,
        "last_step_ns": last_ns,
        "step_wait_s": [round(w, 6) for w in waits],
        "step_sync_s": [round(w, 6) for w in syncs],
        "step_end_ns": ends,
        "checkpoints": checkpoints,
    }


def write_json(path: Path, doc: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    distributed = "WORLD_SIZE" in os.environ and "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    torch.manual_seed(SEED)
    mine = train(args, rank, world)
    if distributed:
        ranks: list = [None] * world
        dist.all_gather_object(ranks, mine)
        dist.barrier()
        dist.destroy_process_group()
    else:
        ranks = [mine]
    if rank == 0:
        write_json(
            args.out,
            {
                "world_size": world,
                "num_workers": args.num_workers,
                "batch_size": args.batch_size,
                "format": args.format,
                "odirect": args.odirect,
                "epochs": args.epochs,
                "compute_s_configured": args.compute_ms / 1000.0,
                "record_bytes": ranks[0]["bytes_read"] // max(1, ranks[0]["samples"]),
                "ranks": ranks,
                "steps": sum(r["steps"] for r in ranks),
                "samples": sum(r["samples"] for r in ranks),
                "bytes_read": sum(r["bytes_read"] for r in ranks),
                "samples_per_s": sum(r["samples_per_s"] for r in ranks),
                "mib_per_s": sum(r["mib_per_s"] for r in ranks),
                "au": sum(r["au"] for r in ranks) / world,
                "wall_s": max(r["wall_s"] for r in ranks),
                "first_step_ns": min(r["first_step_ns"] for r in ranks),
                "last_step_ns": max(r["last_step_ns"] for r in ranks),
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
