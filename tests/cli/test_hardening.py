"""Hostile input to every command (issue #35): an output never replaces or lands inside
the command's own input (named directly, through a symbolic link or a hard link), datagen
never writes through a hard link, every number is bounded before anything scales with
it, input files are read with a size cap, SIGINT ends a command without a traceback, and
the messages name the path and the option. docs/cli.md describes the behaviour."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from trainio_testlib import ROOT, TRAINIO, require_root

sys.path.insert(0, str(ROOT / "tests" / "replay"))
sys.path.insert(0, str(ROOT / "analysis"))
from replay_helpers import MPI_ENV, write_workload

DEMO_TRACE = ROOT / "traces" / "unet3d-demo-1gpu"
CKPT_WORKLOAD = ROOT / "configs" / "llama3_8b.yaml"
PANIC = "panicked"
EDGES = ("0", "-1", str(2**63), str(2**64 - 1), "1e300", "NaN", "inf")


def run(*args: object, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **MPI_ENV}
    return subprocess.run(
        [str(TRAINIO), *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )


def refused(p: subprocess.CompletedProcess[str], *words: str) -> str:
    """The one error line of a refused command, which names each of `words`."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and PANIC not in p.stderr, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    for w in words:
        assert str(w) in p.stderr, (w, p.stderr)
    return line


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    t = tmp_path / "trace"
    shutil.copytree(DEMO_TRACE, t)
    return t


def snapshot(*paths: Path) -> dict[Path, bytes]:
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*")))]
    return {f: f.read_bytes() for f in files if f.is_file()}


# ----------------------------------------------------------------- outputs onto inputs


def test_report_refuses_an_output_onto_its_trace(trace: Path, tmp_path: Path) -> None:
    seg = next(trace.glob("*.parquet"))
    before = snapshot(trace)
    (tmp_path / "sym.html").symlink_to(seg)
    os.link(seg, tmp_path / "hard.html")
    for out in (seg, trace / "new.html", tmp_path / "sym.html", tmp_path / "hard.html"):
        refused(run("report", trace, "-o", out), "-o", out)
    assert snapshot(trace) == before
    assert not (trace / "new.html").exists()
    # the same trace through a symlinked directory is still the input
    (tmp_path / "alias").symlink_to(trace)
    refused(run("report", tmp_path / "alias", "-o", trace / "x.html"), "-o")
    # a path outside the trace is fine
    ok = run("report", trace, "-o", tmp_path / "r.html")
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "r.html").read_text().startswith("<!")
    assert snapshot(trace) == before


def test_export_and_import_refuse_an_output_inside_their_input(trace: Path, tmp_path: Path) -> None:
    refused(run("export", "--fio", trace, "-o", trace / "fio"), "-o", trace / "fio")
    assert not (trace / "fio").exists()
    pfw = tmp_path / "t.pfw"
    pfw.write_text('{"name":"read","cat":"POSIX","pid":1,"tid":1,"ts":1,"dur":2,"args":{"fname":"/a"}}\n')
    (tmp_path / "pfwdir").symlink_to(pfw)
    refused(run("import", "--dftracer", pfw, "-o", tmp_path / "pfwdir"), "-o")
    assert pfw.read_text().startswith('{"name":"read"')


def test_replay_and_datasize_refuse_json_onto_their_workload(tmp_path: Path) -> None:
    wl = write_workload(tmp_path / "w.yaml", files=4, record=4096, batch=1, compute=0.0)
    text = wl.read_text()
    (tmp_path / "sym.json").symlink_to(wl)
    os.link(wl, tmp_path / "hard.json")
    data = tmp_path / "d"
    for out in (wl, tmp_path / "hard.json"):
        refused(run("datasize", "--workload", wl, "--gpus", 1, "--json", out), "--json", out)
        refused(run("replay", "--workload", wl, "--data-dir", data, "--generate", "--json", out), "--json", out)
    # a symlink output is refused as before (the rename would replace the link)
    refused(run("datasize", "--workload", wl, "--gpus", 1, "--json", tmp_path / "sym.json"), "--json")
    assert wl.read_text() == text and not data.exists()


def test_replay_refuses_json_onto_a_file_of_its_dataset(tmp_path: Path) -> None:
    wl = write_workload(tmp_path / "w.yaml", files=4, record=4096, batch=1, compute=0.0)
    data = tmp_path / "d"
    p = run("datagen", "--workload", wl, "--data-dir", data, "-q")
    assert p.returncode == 0, p.stderr
    files = sorted((data / "train").rglob("*.*"))
    assert files
    before = snapshot(data)
    os.link(files[0], tmp_path / "hard.json")
    for out in (files[0], data / "train" / "new.json", data / ".trainio-dataset", tmp_path / "hard.json"):
        line = refused(run("replay", "--workload", wl, "--data-dir", data, "--json", out), "--json", out)
        assert "--data-dir" in line or "the same file" in line, line
    assert snapshot(data) == before
    # the results may sit at the data directory's top level (sweep's default does)
    ok = run("replay", "--workload", wl, "--data-dir", data, "-q", "--json", data / "r.json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads((data / "r.json").read_text())["tool"] == "trainio replay"


def test_replay_refuses_json_inside_its_trace(trace: Path, tmp_path: Path) -> None:
    out = trace / "r.json"
    refused(run("replay", "--trace", trace, "--data-dir", tmp_path / "d", "--generate", "--json", out), "--json")
    assert not out.exists() and not (tmp_path / "d").exists()


def test_datagen_replaces_a_hard_link_instead_of_writing_through_it(tmp_path: Path) -> None:
    wl = write_workload(tmp_path / "w.yaml", files=2, record=4096, batch=1, compute=0.0)
    data = tmp_path / "d"
    assert run("datagen", "--workload", wl, "--data-dir", data, "-q").returncode == 0
    victim = sorted((data / "train").rglob("*.*"))[0]
    precious = tmp_path / "precious"
    precious.write_bytes(b"keep me" * 1000)  # not the dataset file's size: datagen rewrites it
    victim.unlink()
    os.link(precious, victim)
    p = run("datagen", "--workload", wl, "--data-dir", data, "-q")
    assert p.returncode == 0, p.stderr
    assert precious.read_bytes() == b"keep me" * 1000
    assert os.stat(victim).st_nlink == 1 and victim.stat().st_size != precious.stat().st_size


# ----------------------------------------------------------------------- huge numbers


@pytest.mark.parametrize(
    ("cmd", "args", "words"),
    [
        ("datagen", ("--steps", 2**64 - 1), ("--steps",)),
        ("datagen", ("--batch-size", 2**64 - 1), ("--batch-size",)),
        ("datagen", ("--steps", 10**12), ("--steps",)),
        ("datagen", ("--steps", 10**7), ("--steps", "20000000")),  # 4×10^7 files: over the bound, at once
        ("replay", ("--steps", 10**7), ("--steps", "20000000")),
        ("replay", ("--epochs", 2**63), ("--epochs",)),
        ("replay", ("--computation-time", "1e300"), ("--computation-time",)),
    ],
)
def test_huge_numbers_are_refused_before_anything_scales(tmp_path: Path, cmd: str, args: tuple, words: tuple) -> None:
    wl = write_workload(tmp_path / "w.yaml", files=4, record=4096, batch=4, compute=0.0)
    extra = ("--generate",) if cmd == "replay" else ()
    t = time.monotonic()
    refused(run(cmd, "--workload", wl, "--data-dir", tmp_path / "d", *extra, *args, "-q"), *words)
    assert time.monotonic() - t < 20, "refused only after work in proportion to the number"
    assert not (tmp_path / "d").exists(), "a refused run left its data directory behind"


def test_a_model_of_huge_depth_is_refused_by_plan_only(tmp_path: Path) -> None:
    p = run(
        "replay", "--workload", CKPT_WORKLOAD, "--gpus", 8, "--data-dir", tmp_path / "never",
        "--plan-only", "--param", "model.num_layers=1000000000000", timeout=30,
    )  # fmt: skip
    refused(p, "model.num_layers", "100000")


def test_workload_and_import_inputs_are_read_with_a_cap(tmp_path: Path) -> None:
    for cmd in (("datasize", "--gpus", 1), ("datagen", "--data-dir", tmp_path / "d")):
        refused(run(cmd[0], "--workload", "/dev/zero", *cmd[1:], timeout=30), "/dev/zero")
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (2 << 20) + "\n")
    refused(run("datasize", "--workload", big, "--gpus", 1), str(big), "MiB")
    refused(run("import", "--blktrace", "/dev/zero", "-o", tmp_path / "o", timeout=30), "--blktrace", "/dev/zero")
    (tmp_path / "adir").mkdir()
    refused(run("import", "--dftracer", tmp_path / "adir", "-o", tmp_path / "o"), "--dftracer", "is a directory")
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------- messages


def test_messages_name_the_path_and_the_option(tmp_path: Path) -> None:
    wl = write_workload(tmp_path / "w.yaml", files=2, record=4096, batch=1, compute=0.0)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    line = refused(run("datagen", "--workload", wl, "--data-dir", dangling), "--data-dir", dangling)
    assert "os error" not in line or str(dangling) in line
    assert not (tmp_path / "gone").exists()
    refused(run("analyze", DEMO_TRACE, "--bin-s", "1e-12"), "--bin-s", "1 ns")
    refused(run("analyze", DEMO_TRACE, "--bin-s", "1e10"), "--bin-s", "1e+06")
    p = subprocess.run([str(TRAINIO)], capture_output=True, text=True, timeout=30)
    assert (p.returncode, p.stdout) == (2, "") and p.stderr.startswith("Usage: trainio COMMAND")


# ----------------------------------------------------------------------------- SIGINT


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo trace's rows 400 times over, one copy after the other in time: a report
    of it takes several seconds (the demo trace alone is done in about one, mostly the
    interpreter starting), so a SIGINT at 0.3 or 1 s lands inside the work on any host."""
    import pyarrow.compute as pc

    from trainio_analysis.trace import read_rows, write_trace

    rows = read_rows(DEMO_TRACE)
    span = pc.max(rows["complete_ns"]).as_py() - pc.min(rows["issue_ns"]).as_py() + 1

    def shifted(k: int):
        for name in ("issue_ns", "complete_ns"):
            i = rows.schema.get_field_index(name)
            yield i, name, pc.add(rows[name], k * span)

    def copies():
        for k in range(400):
            t = rows
            for i, name, col in shifted(k):
                t = t.set_column(i, name, col)
            yield t

    out = tmp_path_factory.mktemp("long") / "trace"
    write_trace(out, copies())
    return out


@pytest.mark.parametrize("delay", [0.3, 1.0])
def test_sigint_in_an_analysis_command_ends_without_a_traceback(tmp_path: Path, delay: float, long_trace: Path) -> None:
    out = tmp_path / "r.html"
    p = subprocess.Popen(
        [str(TRAINIO), "report", long_trace, "-o", out],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    if p.returncode == 0:
        pytest.fail(f"report finished before SIGINT at {delay} s: the test needs a slower report")
    assert p.returncode == 130, (p.returncode, stderr)
    assert stderr == "trainio report: interrupted\n", stderr
    assert not out.exists() and not list(tmp_path.glob(".r.html.*"))


def test_sigint_during_run_2_of_3_keeps_run_1_in_the_json(tmp_path: Path) -> None:
    wl = write_workload(tmp_path / "w.yaml", files=8, record=4096, batch=1, compute=0.25, threads=1)
    data, out = tmp_path / "d", tmp_path / "r.json"
    env = {**os.environ, **MPI_ENV}
    cmd = [str(TRAINIO), "replay", "--workload", wl, "--data-dir", data, "--generate", "-q"]
    p = subprocess.Popen(
        [*map(str, cmd), "--steps", "4", "--runs", "3", "--json", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert p.stdout is not None
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith("run 1 of 3"):
            break
    # the file is written just after the line is printed
    deadline = time.monotonic() + 5
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not out.exists():
        p.kill()
        p.communicate()
        pytest.fail("run 1 finished and the JSON does not hold it")
    time.sleep(0.2)  # inside run 2 (each run is 4 steps of 0.25 s)
    p.send_signal(signal.SIGINT)
    rest, stderr = p.communicate(timeout=60)
    assert p.returncode in (-signal.SIGINT, 130), (p.returncode, stderr)
    assert "run 2 of 3" not in rest, "run 2 finished before SIGINT: the test did not interrupt it"
    assert PANIC not in stderr
    r = json.loads(out.read_text())
    assert (r["run_count"], r["runs_requested"], r["complete"]) == (1, 3, False)
    assert [x["run"] for x in r["runs"]] == [1] and r["runs"][0]["steps"] > 0


# ------------------------------------------------------------------ fuzz of the numbers


def _fuzz_cases(tmp: Path) -> list[tuple[str, str, list[str]]]:
    """(label, option, argv) for each numeric option of each command at each edge value:
    commands that would do real work are kept tiny (--plan-only, a 4-file workload, the
    demo trace), each case with a data directory of its own."""
    wl = write_workload(tmp / "w.yaml", files=4, record=4096, batch=1, compute=0.0, threads=1)
    trace = tmp / "trace"
    shutil.copytree(DEMO_TRACE, trace)
    sel = ["--pid", "--bin-s", "--burst-gap-ms"]
    opts = {
        "analyze": [*sel, "--step-gap-ms"],
        "compare": sel,
        "report": sel,
        "export": ["--pid"],
        "plan": ["--gpus", "--transfer-size", "--threshold", "--seed"],
        "replay": [
            "--gpus",
            "--runs",
            "--batch-size",
            "--steps",
            "--epochs",
            "--computation-time",
            "--read-threads",
            "--prefetch-size",
            "--transfer-size",
            "--threshold",
            "--seed",
        ],  # fmt: skip
        "trace": ["--burst-gap-ms", "--gpus"],
        "datagen": ["--gpus", "--batch-size", "--steps", "--seed"],
        "sweep": ["--start-gpus", "--max-gpus", "--steps", "--computation-time"],
        "datasize": ["--gpus", "--hosts", "--client-ram"],
    }
    cases = []
    for cmd, names in opts.items():
        for o in names:
            for v in EDGES:
                n = len(cases)
                d, out = str(tmp / f"d{n}"), str(tmp / f"out{n}")
                base = {
                    "analyze": ["analyze", str(trace)],
                    "compare": ["compare", str(trace), str(trace)],
                    "report": ["report", str(trace), "-o", out],
                    "export": ["export", "--fio", str(trace), "-o", out],
                    "plan": ["replay", "--workload", str(CKPT_WORKLOAD), "--data-dir", d, "--plan-only"],
                    "replay": ["replay", "--workload", str(wl), "--data-dir", d, "--generate", "-q"],
                    "trace": ["replay", "--trace", str(trace), "--data-dir", d, "--generate", "-q"],
                    "datagen": ["datagen", "--workload", str(wl), "--data-dir", d, "-q"],
                    "sweep": ["sweep", "--workload", str(wl), "--data-dir", d, "--generate", "-q"],
                    "datasize": ["datasize", "--workload", str(wl)],
                }[cmd]
                extras = {"plan": ["--gpus", "8"], "sweep": ["--max-gpus", "2"], "datasize": ["--gpus", "1"]}
                extra = extras.get(cmd, [])
                extra = [] if o in extra else extra
                cases.append((f"{cmd} {o} {v}", o, [*base, *extra, o, v]))
    return cases


def test_fuzz_numeric_options_at_the_edges(tmp_path: Path) -> None:
    """0, -1, 2^63, 2^64-1, 1e300, NaN and inf in every numeric option of every command
    (record's in test_record_numbers_at_the_edges): exit 0 or 2, never a traceback or a
    panic, and every refusal is one line naming the option."""
    cases = _fuzz_cases(tmp_path)
    env = {**os.environ, **MPI_ENV}

    def one(case: tuple[str, str, list[str]]) -> tuple[str, str, subprocess.CompletedProcess[str]]:
        label, option, argv = case
        p = subprocess.run([str(TRAINIO), *argv], capture_output=True, text=True, timeout=120, env=env)
        return label, option, p

    t = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, cases))
    elapsed = time.monotonic() - t
    bad = [
        f"{label}: exit {p.returncode}: {p.stderr.strip()[-300:]}"
        for label, option, p in results
        if p.returncode not in (0, 2)
        or "Traceback" in p.stderr
        or PANIC in p.stderr
        or (p.returncode == 2 and option not in p.stderr)
    ]
    assert not bad, "\n".join(bad)
    assert len(results) > 250
    print(f"{len(results)} cases in {elapsed:.1f} s")


@pytest.mark.root
def test_record_numbers_at_the_edges(tmp_path: Path) -> None:
    """record's numeric options at the edges: refused in one line naming the option
    (exit 2) before any BPF program is loaded; no panic."""
    require_root("trainio record loads BPF programs")
    for o in ("--duration", "--ringbuf-mb", "--segment-mb", "--segment-s"):
        for v in EDGES:
            p = run("record", "-o", tmp_path / f"t{o}{v}", o, v, "--", "true", timeout=60)
            assert p.returncode == 2, (o, v, p.returncode, p.stderr)
            assert o in p.stderr and PANIC not in p.stderr, p.stderr
