"""`replay --runs N` (MLPerf's result: the mean of 5 runs on one dataset) and the run
rules checked against the results: dataset size, AU threshold, cache, number of runs, and
the run's MLPerf Storage v3.0 category."""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

from replay_helpers import load_json, run_trainio, write_workload

RULES = ["dataset_size", "au_threshold", "cache", "runs", "category"]


def replay(tmp_path, *extra, name="r.json", check=True):
    wl = write_workload(tmp_path / "w.yaml", files=16, record=256 << 10, batch=2, threads=2, compute=0.01)
    out = tmp_path / name
    p = run_trainio(
        "replay", "--workload", wl, "--gpus", 2, "--data-dir", tmp_path / "data", "--generate", "-q",
        "--steps", 4, "--json", out, *extra, check=check,
    )  # fmt: skip
    return p, out


def by_name(rules):
    assert [r["name"] for r in rules] == RULES, rules
    for r in rules:
        assert isinstance(r["pass"], bool) and r["reason"], r
    # The test workload's model ("test") is none of v3.0's: whatif, and not submittable.
    category = rules[-1]
    assert (category["verdict"], category["pass"]) == ("whatif", False), category
    assert "test is not a training workload of MLPerf Storage v3.0" in category["reason"], category
    return {r["name"]: r for r in rules}


def test_three_runs_report_each_run_and_the_spread(tmp_path):
    p, out = replay(tmp_path, "--runs", 3)
    j = load_json(out)
    assert j["run_count"] == 3 and [r["run"] for r in j["runs"]] == [1, 2, 3]
    for r in j["runs"]:
        # Each run is a whole single-run result on the same dataset.
        assert r["gpus"] == 2 and r["steps"] == 4 and r["settings"]["dataset_files"] == j["settings"]["dataset_files"]
        assert r["bytes_read"] == j["runs"][0]["bytes_read"] > 0
    for key in ["au_percent", "throughput_mib_s", "throughput_mb_s", "samples_per_s", "wall_s"]:
        values = [r[key] for r in j["runs"]]
        s = j["summary"][key]
        assert s["mean"] == statistics.fmean(values) or abs(s["mean"] - statistics.fmean(values)) < 1e-9 * s["mean"]
        assert (s["min"], s["max"]) == (min(values), max(values))
        assert abs(s["stdev"] - statistics.stdev(values)) <= 1e-9 * max(1.0, s["stdev"])
    assert j["au_percent"] == j["summary"]["au_percent"]["mean"]
    assert j["pass"] == all(r["pass"] for r in j["runs"])
    rules = by_name(j["rules"])
    # 16 files of 256 KiB on a machine with GiBs of RAM: below MLPerf's dataset size, and
    # cached reads (no --odirect, no --drop-caches); 3 runs, not 5.
    assert not rules["dataset_size"]["pass"] and "num_files_train ≥" in rules["dataset_size"]["reason"]
    assert not rules["cache"]["pass"] and "page cache" in rules["cache"]["reason"]
    assert not rules["runs"]["pass"] and "3 run(s)" in rules["runs"]["reason"]
    assert rules["au_threshold"]["pass"] == all(r["au_percent"] >= 90.0 for r in j["runs"])
    # The table: a line per run and the four statistics, then the rules with their verdicts.
    lines = p.stdout.splitlines()
    assert sum(line.split()[:1] in (["1"], ["2"], ["3"]) for line in lines) == 3, p.stdout
    for stat in ["mean", "min", "max", "stdev"]:
        assert any(line.split()[:1] == [stat] for line in lines), p.stdout
    assert "FAIL dataset_size" in p.stdout and "FAIL cache" in p.stdout and "FAIL runs" in p.stdout
    # The page-cache warning is said once for the command, not once per run.
    assert p.stderr.count("smaller than 5 × the RAM") == 1, p.stderr


def test_one_run_keeps_its_json_and_adds_the_rules(tmp_path):
    p, out = replay(tmp_path, "--odirect", "--threshold", 100)
    j = load_json(out)
    assert "runs" not in j and "summary" not in j and "run_count" not in j
    assert j["gpus"] == 2 and j["steps"] == 4 and j["per_epoch"] and j["settings"]["odirect"] is True
    rules = by_name(j["rules"])
    assert rules["cache"]["pass"] and "O_DIRECT" in rules["cache"]["reason"]
    # A sleep never ends exactly on time: AU < 100%, so --threshold 100 fails, named.
    assert j["au_percent"] < 100 and not rules["au_threshold"]["pass"]
    assert "--threshold" in rules["au_threshold"]["reason"]
    assert "FAIL au_threshold" in p.stdout and "PASS cache" in p.stdout


def test_runs_refused_where_nothing_repeats(tmp_path):
    p, _ = replay(tmp_path, "--runs", 0, check=False)
    assert p.returncode == 2 and "--runs" in p.stderr
    llama = tmp_path / "llama.yaml"
    llama.write_text(
        "model:\n  name: m\n  num_layers: 1\n  transformer: {vocab_size: 8, hidden_size: 8, ffn_hidden_size: 8}\n"
        "workflow:\n  checkpoint: true\ncheckpoint:\n  num_checkpoints_write: 1\n"
    )
    p = run_trainio(
        "replay", "--workload", llama, "--data-dir", tmp_path / "ck", "--runs", 2, "--plan-only", check=False
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--runs 2" in p.stderr, p.stderr
    assert not (tmp_path / "ck").exists()


def sectors_read(dev: str) -> int:
    return int(Path(f"/sys/block/{Path(dev).name}/stat").read_text().split()[2]) * 512


def test_each_run_reads_storage_only_when_the_cache_rule_passes(loop_fs, tmp_path):
    """On ext4 over a loop device: without --drop-caches the later runs read the page
    cache (the device sees one dataset's bytes for 3 runs, and the cache rule fails); with
    it, or with --odirect, every run reads the device (3 datasets' bytes, rule passes)."""
    dev, _, mnt = loop_fs
    wl = write_workload(tmp_path / "w.yaml", files=32, record=1 << 20, batch=4, threads=4, compute=0.001)
    data = mnt / "data"
    run_trainio("datagen", "--workload", wl, "--gpus", 2, "--data-dir", data, "-q")
    dataset = 32 << 20
    seen = {}
    for label, flags in {"cached": [], "dropped": ["--drop-caches"], "odirect": ["--odirect"]}.items():
        # Remounting evicts this file system's pages: each case starts with a cold cache.
        subprocess.run(["umount", str(mnt)], check=True)
        subprocess.run(["mount", dev, str(mnt)], check=True)
        before = sectors_read(dev)
        out = tmp_path / f"{label}.json"
        run_trainio(
            "replay", "--workload", wl, "--gpus", 2, "--data-dir", data, "-q", "--runs", 3, "--json", out, *flags
        )
        seen[label] = sectors_read(dev) - before
        j = load_json(out)
        assert all(r["bytes_read"] == dataset for r in j["runs"]), label
        cache = by_name(j["rules"])["cache"]
        assert cache["pass"] == (label != "cached"), (label, cache)
    assert seen["cached"] < 1.5 * dataset, seen
    assert seen["dropped"] >= 2.9 * dataset and seen["odirect"] >= 2.9 * dataset, seen
