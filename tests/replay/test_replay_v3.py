"""MLPerf Storage v3.0's run rules on its own files (tests/replay/data/dlio-configs/
mlperf-storage-v3, unchanged): the AU threshold of each model, the CLOSED / OPEN / whatif
category of a run from the keys it changes and the accelerator its file is for, and the
throughput one accelerator of each workload needs, in datasize, sweep and the replay's
summary. Runs are on tmpfs, scaled down by dataset.num_files_train (a key CLOSED may set)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from replay_helpers import load_json, run_trainio

V3 = Path(__file__).resolve().parent / "data" / "dlio-configs" / "mlperf-storage-v3"
MIB = 1 << 20


def value(path: Path, key: str) -> float:
    return float(re.search(rf"^\s*{key}:\s*([0-9.]+)", path.read_text(), re.M).group(1))


def need_mib_s(path: Path) -> float:
    """record × batch / computation_time of the file, by hand."""
    return value(path, "record_length_bytes") * value(path, "batch_size") / value(path, "computation_time") / MIB


def replay(tmpfs_dir: Path, name: str, *args) -> tuple[dict, str]:
    out = tmpfs_dir / f"{name}.json"
    p = run_trainio(
        "replay", "--workload", V3 / f"{name}.yaml", "--data-dir", tmpfs_dir / "data", "--generate", "-q",
        "--json", out, *args,
    )  # fmt: skip
    j = load_json(out)
    return j, p.stdout


def rule(j: dict, name: str) -> dict:
    return next(r for r in j["rules"] if r["name"] == name)


def test_retinanet_b200_as_published_is_closed_with_its_85_percent_threshold(tmpfs_dir: Path) -> None:
    # 48 files of batch 24: 2 steps per epoch, 8 epochs of 0.04755 s steps; --read-threads
    # sets reader.read_threads, which CLOSED may change.
    j, out = replay(tmpfs_dir, "retinanet_b200", "--param", "dataset.num_files_train=48", "--read-threads", 4)
    assert j["threshold_percent"] == 85.0
    au = rule(j, "au_threshold")
    assert "threshold 85% for retinanet" in au["reason"] and "metric.au" in au["reason"], au
    assert au["pass"] == (j["au_percent"] >= 85.0)
    cat = rule(j, "category")
    assert (cat["verdict"], cat["pass"]) == ("CLOSED", True), cat
    assert "dataset.num_files_train" in cat["reason"] and "reader.read_threads" in cat["reason"]
    assert j["rules"][-1] == cat and f"PASS category      {cat['reason']}" in out
    # The need of one B200: record × batch / compute.
    assert j["settings"]["required_mib_s_per_gpu"] == pytest.approx(need_mib_s(V3 / "retinanet_b200.yaml"))
    assert re.search(r"need\s+155\.5 MiB/s per simulated GPU at 100% AU", out), out


def test_open_and_whatif_changes_are_named(tmpfs_dir: Path) -> None:
    # reader.data_loader is OPEN's to change; train.computation_time nobody's.
    j, _ = replay(
        tmpfs_dir, "retinanet_mi355", "--param", "dataset.num_files_train=72", "--param", "reader.data_loader=pytorch"
    )
    cat = rule(j, "category")
    assert (cat["verdict"], cat["pass"]) == ("OPEN", True) and "reader.data_loader" in cat["reason"], cat
    j, out = replay(tmpfs_dir, "retinanet_mi355", "--param", "dataset.num_files_train=72", "--computation-time", 0.01)
    cat = rule(j, "category")
    assert (cat["verdict"], cat["pass"]) == ("whatif", False), cat
    assert "train.computation_time" in cat["reason"] and "dataset.num_files_train" not in cat["reason"], cat
    assert "FAIL category" in out
    # An H100 file as published: h100 is whatif-only in v3.0, whatever is changed.
    j, _ = replay(tmpfs_dir, "retinanet_h100", "--param", "dataset.num_files_train=16")
    cat = rule(j, "category")
    assert cat["verdict"] == "whatif" and "h100 is whatif-only" in cat["reason"], cat
    assert j["threshold_percent"] == 85.0


def test_unet3d_threshold_comes_from_the_edition_without_metric_au(tmpfs_dir: Path) -> None:
    # Without metric.au the edition's table decides: 90% for unet3d.
    wl = tmpfs_dir / "unet3d_b200.yaml"
    text = (V3 / "unet3d_b200.yaml").read_text()
    wl.write_text(text.replace("metric:\n  au: 0.90\n", ""))
    assert "metric:" not in wl.read_text()
    out = tmpfs_dir / "u.json"
    run_trainio(
        "replay", "--workload", wl, "--data-dir", tmpfs_dir / "data", "--generate", "-q", "--json", out,
        "--param", "dataset.num_files_train=7", "--param", "dataset.record_length_bytes=65536",
        "--param", "dataset.record_length_bytes_stdev=0", "--epochs", 1,
    )  # fmt: skip
    j = load_json(out)
    assert j["threshold_percent"] == 90.0
    assert "MLPerf Storage v3.0's threshold for unet3d" in rule(j, "au_threshold")["reason"]
    cat = rule(j, "category")
    assert cat["verdict"] == "whatif" and "dataset.record_length_bytes" in cat["reason"], cat


@pytest.mark.parametrize(
    ("name", "accelerator"),
    [("unet3d_b200", "b200"), ("unet3d_h100", "h100"), ("retinanet_b200", "b200"), ("retinanet_mi355", "mi355")],
)
def test_datasize_prints_the_need_of_one_accelerator(tmp_path: Path, name: str, accelerator: str) -> None:
    out = tmp_path / "d.json"
    p = run_trainio(
        "datasize", "--workload", V3 / f"{name}.yaml", "--gpus", 8, "--client-ram", "128G", "--json", out
    )  # fmt: skip
    j = load_json(out)
    need = need_mib_s(V3 / f"{name}.yaml")
    assert j["accelerator"] == accelerator
    assert j["per_gpu_need_mib_s"] == pytest.approx(need, rel=1e-9)
    assert f"one simulated {accelerator} needs {need:.1f} MiB/s at 100% AU" in p.stdout, p.stdout
    assert f"storage for 8 of them: {8 * need:.1f} MiB/s" in p.stdout


def test_derived_accelerators_need_what_the_templates_say(tmp_path: Path) -> None:
    """B200 = H100's compute halved: one B200 needs twice an H100's throughput. MI355 = B200
    with batch and compute × 1.5: the same need."""

    def need(name: str) -> float:
        out = tmp_path / f"{name}.json"
        run_trainio("datasize", "--workload", V3 / f"{name}.yaml", "--gpus", 1, "--client-ram", "1G", "--json", out)
        return load_json(out)["per_gpu_need_mib_s"]

    # 0.323 / 2 = 0.1615, written 0.162 in the template.
    assert need("unet3d_b200") / need("unet3d_h100") == pytest.approx(0.323 / 0.162)
    assert need("retinanet_mi355") == pytest.approx(need("retinanet_b200"))


def test_sweep_prints_the_need_of_one_accelerator(tmpfs_dir: Path) -> None:
    out = tmpfs_dir / "sweep.json"
    p = run_trainio(
        "sweep", "--workload", V3 / "retinanet_b200.yaml", "--data-dir", tmpfs_dir / "data", "--generate", "-q",
        "--max-gpus", 1, "--param", "dataset.num_files_train=48", "--epochs", 1, "--json", out,
    )  # fmt: skip
    need = need_mib_s(V3 / "retinanet_b200.yaml")
    assert f"one simulated b200 needs {need:.1f} MiB/s at 100% AU, {need * 0.85:.1f} MiB/s at its 85% threshold" in (
        p.stdout
    ), p.stdout
    j = load_json(out)
    assert (j["accelerator"], j["threshold_percent"]) == ("b200", 85.0)
    assert j["per_gpu_need_mib_s"] == pytest.approx(need)
