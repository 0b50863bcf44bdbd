"""Both readers on corrupt segments: a read, or one line naming the file and exit 2.

Segments written by the recorder (traces/) are mutated: random bytes flipped, or the file
cut short. Each mutant is read by the Rust reader (``trainio-trace-rows``, the reader of
``trainio replay --trace``) and analyzed by ``trainio analyze`` (the Python reader, and
the Rust one again through the job model). Every outcome must be a read (exit 0, its
output parses) or exit 2 with exactly one line on stderr naming the file: no traceback,
no panic, no other exit status, and no hang (a time limit per case).

A read may differ from the original's: without checksums in the pages, a flipped byte
can decode to other values that break none of SCHEMA.md's rules. The test counts those
apart and prints every count. The RNG's seed is printed; ``TRAINIO_FUZZ_SEED=N`` replays a
run, ``TRAINIO_FUZZ_CASES=N`` sets the number of mutants (default 240).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from analysis_helpers import ROOT

RUST_READER = ROOT / "target/release/trainio-trace-rows"
DRIVER = Path(__file__).resolve().parent / "analyze_driver.py"
BASES = [ROOT / "traces/unet3d-demo-1gpu/seg-000000.parquet", ROOT / "traces/unet3d-demo-8gpu/seg-000000.parquet"]
CASE_TIMEOUT_S = 30.0


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Flip 1 to 8 random bits (one case in five: cut the file at a random length)."""
    if rng.random() < 0.2:
        cut = rng.randrange(len(data))
        return data[:cut], f"cut at {cut}"
    b = bytearray(data)
    where = []
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
        where.append(i)
    return bytes(b), f"bits flipped at {sorted(where)}"


class Analyzer:
    """A long-lived analyze_driver.py, restarted when a case hangs or kills it."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        return subprocess.Popen(
            [sys.executable, str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def analyze(self, trace: Path) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(["analyze", str(trace), "--json"]) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], CASE_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            hung = self.proc.poll() is None
            self.close()
            return {"rc": None, "hung": hung, "stderr": "", "stdout": "", "traceback": None}
        return json.loads(line)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()
            self.proc = None


def rust_read(trace: Path) -> dict:
    try:
        p = subprocess.run(
            [str(RUST_READER), str(trace)], capture_output=True, text=True, timeout=CASE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return {"rc": None, "hung": True, "stderr": "", "stdout": ""}
    return {"rc": p.returncode, "stderr": p.stderr, "stdout": p.stdout}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def analysis_digest(stdout: str) -> str:
    result = json.loads(stdout)
    result.pop("trace", None)  # the path differs from case to case
    return digest(json.dumps(result, sort_keys=True))


def judge(reader: str, case: Path, out: dict, original: str, counts: Counter) -> str | None:
    """None when the outcome keeps the contract, else what is wrong."""
    if out["rc"] is None:
        return "hung" if out.get("hung") else "died (no answer)"
    if out.get("traceback") or "Traceback" in out["stderr"] or "panicked" in out["stderr"]:
        return f"traceback or panic: {out['stderr'][-600:]}"
    if out["rc"] == 0:
        try:
            same = (analysis_digest(out["stdout"]) if reader == "analyze" else digest(out["stdout"])) == original
        except (json.JSONDecodeError, AttributeError) as exc:
            return f"exit 0 with unreadable output ({exc})"
        counts[f"{reader}: read, as the original" if same else f"{reader}: read, values differ"] += 1
        return None
    lines = out["stderr"].splitlines()
    if out["rc"] != 2:
        return f"exit {out['rc']}: {out['stderr'][-600:]}"
    if len(lines) != 1 or str(case) not in lines[0]:
        return f"exit 2 but not one line naming the file: {out['stderr'][-600:]!r}"
    counts[f"{reader}: refused (exit 2, one line)"] += 1
    return None


@pytest.mark.slow
def test_both_readers_read_or_refuse_corrupt_segments_in_one_line(tmp_path: Path) -> None:
    assert RUST_READER.exists(), f"{RUST_READER} is missing: run make"
    seed = int(os.environ.get("TRAINIO_FUZZ_SEED", random.SystemRandom().randrange(1 << 32)))
    cases = int(os.environ.get("TRAINIO_FUZZ_CASES", "240"))
    print(f"\nreader fuzz: seed {seed} (TRAINIO_FUZZ_SEED={seed} replays this run), {cases} mutants")
    rng = random.Random(seed)
    analyzer = Analyzer()
    counts: Counter = Counter()
    failures: list[str] = []
    originals = {}
    start = time.monotonic()
    try:
        for base in BASES:
            d = tmp_path / f"original-{base.parent.name}"
            d.mkdir()
            (d / "seg-000000.parquet").write_bytes(base.read_bytes())
            a, r = analyzer.analyze(d), rust_read(d)
            assert a["rc"] == 0 and r["rc"] == 0, (a["stderr"], r["stderr"])
            originals[base] = (analysis_digest(a["stdout"]), digest(r["stdout"]))
        for k in range(cases):
            base = BASES[k % len(BASES)]
            data, how = mutate(base.read_bytes(), rng)
            case = tmp_path / f"case-{k:04d}"
            case.mkdir()
            (case / "seg-000000.parquet").write_bytes(data)
            for reader, out in (("analyze", analyzer.analyze(case)), ("rust", rust_read(case))):
                original = originals[base][0 if reader == "analyze" else 1]
                wrong = judge(reader, case, out, original, counts)
                if wrong:
                    failures.append(f"case {k} ({base.parent.name}, {how}), {reader}: {wrong}")
    finally:
        analyzer.close()
    elapsed = time.monotonic() - start
    for key in sorted(counts):
        print(f"  {key}: {counts[key]}")
    print(f"  {len(failures)} broke the contract; {elapsed:.1f} s")
    assert not failures, f"seed {seed}: " + "\n".join(failures[:10])
    assert sum(counts.values()) == 2 * cases
