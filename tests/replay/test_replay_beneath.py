"""Every file operation of datagen, replay and checkpoint writing stays beneath --data-dir:
a symbolic link inside it is refused with a message naming the path, and nothing
outside is written, truncated or read (issue #20 item 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from replay_helpers import ROOT, load_json, run_trainio, write_workload


def _outside(tmp: Path) -> Path:
    out = tmp / "outside"
    out.mkdir()
    (out / "precious").write_bytes(b"keep me")
    return out


def _untouched(out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == ["precious"]
    assert (out / "precious").read_bytes() == b"keep me"


@pytest.mark.parametrize("where", ["train-dir", "data-file", "marker"])
def test_datagen_refuses_links_inside_the_data_dir(tmpfs_dir: Path, where: str) -> None:
    wl = write_workload(tmpfs_dir / "wl.yaml", files=4, record=64 << 10, batch=2, compute=0.01)
    out = _outside(tmpfs_dir)
    data = tmpfs_dir / "d"
    run_trainio("datagen", "--workload", wl, "--data-dir", data)
    files = sorted((data / "train").iterdir())
    link = {"train-dir": data / "train", "data-file": files[1], "marker": data / ".trainio-dataset"}[where]
    if link.is_dir():
        for f in link.iterdir():
            f.unlink()
        link.rmdir()
        link.symlink_to(out)
    else:
        link.unlink()
        link.symlink_to(out / "precious")
    p = run_trainio("datagen", "--workload", wl, "--data-dir", data, check=False)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "symbolic link" in lines[0] and str(link) in lines[0], p.stderr
    _untouched(out)


def test_replay_does_not_read_through_a_link(tmpfs_dir: Path) -> None:
    wl = write_workload(tmpfs_dir / "wl.yaml", files=4, record=64 << 10, batch=2, compute=0.01)
    data = tmpfs_dir / "d"
    run_trainio("datagen", "--workload", wl, "--data-dir", data)
    victim = sorted((data / "train").iterdir())[2]
    real = tmpfs_dir / "elsewhere.bin"
    victim.rename(real)
    victim.symlink_to(real)  # the right size, outside the directory
    p = run_trainio("replay", "--workload", wl, "--data-dir", data, "--gpus", 1, check=False)
    assert p.returncode == 2 and "symbolic link" in p.stderr and str(victim) in p.stderr, p.stderr


def test_checkpoint_writes_refuse_a_linked_checkpoint_folder(tmpfs_dir: Path) -> None:
    out = _outside(tmpfs_dir)
    data = tmpfs_dir / "d"
    data.mkdir()
    (data / "checkpoints").symlink_to(out)
    scale = [
        "model.num_layers=2",
        "model.transformer.vocab_size=1024",
        "model.transformer.hidden_size=256",
        "model.transformer.ffn_hidden_size=512",
        "checkpoint.num_checkpoints_write=1",
        "checkpoint.num_checkpoints_read=0",
        "checkpoint.time_between_checkpoints=0",
        "checkpoint.checkpoint_folder=checkpoints",
    ]
    args = [a for s in scale for a in ("--param", s)]
    p = run_trainio(
        "replay",
        "--workload",
        ROOT / "configs" / "llama3_8b.yaml",
        "--gpus",
        8,
        "--data-dir",
        data,
        "--force",
        *args,
        check=False,
    )
    assert p.returncode == 2 and "symbolic link" in p.stderr, (p.stdout, p.stderr)
    _untouched(out)
    # The same run into a real folder writes its files there.
    (data / "checkpoints").unlink()
    j = tmpfs_dir / "r.json"
    run_trainio(
        "replay", "--workload", ROOT / "configs" / "llama3_8b.yaml", "--gpus", 8, "--data-dir", data, *args, "--json", j
    )
    written = sum(f.stat().st_size for f in (data / "checkpoints").rglob("*") if f.is_file())
    assert written == load_json(j)["checkpoint"]["planned_bytes"] and written > 0
    assert not any(os.path.islink(p) for p in (data / "checkpoints").rglob("*"))


def test_a_relative_data_dir_is_the_directory_it_names(tmpfs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--data-dir d` from the directory holding d: datagen and replay work in d itself
    (a relative directory is made absolute once, not joined to itself)."""
    wl = write_workload(tmpfs_dir / "wl.yaml", files=4, record=64 << 10, batch=2, compute=0.01)
    monkeypatch.chdir(tmpfs_dir)
    run_trainio("datagen", "--workload", wl, "--data-dir", "d")
    assert (tmpfs_dir / "d" / ".trainio-dataset").is_file() and len(list((tmpfs_dir / "d" / "train").iterdir())) == 4
    run_trainio("replay", "--workload", wl, "--data-dir", "d", "--gpus", 1, "--json", "r.json")
    r = load_json(tmpfs_dir / "r.json")
    assert r["settings"]["data_dir"] == str(tmpfs_dir / "d") and r["bytes_read"] == 4 * (64 << 10)
    assert sorted(p.name for p in tmpfs_dir.iterdir()) == ["d", "r.json", "wl.yaml"]
