"""Workload values that would size the dataset wrongly are refused as the user meets them:
one line naming the file and the key, exit 2, nothing written (issue #20 item 6)."""

from __future__ import annotations

from pathlib import Path

import pytest
from replay_helpers import run_trainio, write_workload


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("record_length_bytes", "1e30", "beyond 1 TiB"),
        ("record_length_bytes", ".nan", "finite"),
        ("computation_time", ".nan", "finite"),
        ("num_files_train", "1e20", "too large"),
    ],
)
def test_bad_numbers_are_one_line_exit_2(tmpfs_dir: Path, key: str, value: str, says: str) -> None:
    wl = write_workload(tmpfs_dir / "wl.yaml", files=8, record=64 << 10)
    text = wl.read_text()
    lines = [f"  {key}: {value}" if line.strip().startswith(f"{key}:") else line for line in text.splitlines()]
    assert lines != text.splitlines(), key
    wl.write_text("\n".join(lines) + "\n")
    for cmd in (["datagen"], ["replay", "--generate"]):
        p = run_trainio(*cmd, "--workload", wl, "--data-dir", tmpfs_dir / "d", check=False)
        assert p.returncode == 2, (cmd, p.stdout, p.stderr)
        err = p.stderr.strip().splitlines()
        assert len(err) == 1 and str(wl) in err[0] and says in err[0], p.stderr
        assert not (tmpfs_dir / "d").exists()


def test_a_typo_is_named_and_an_object_storage_without_bucket_is_refused(tmpfs_dir: Path) -> None:
    wl = write_workload(tmpfs_dir / "wl.yaml", files=8, record=64 << 10, batch=2)
    wl.write_text(wl.read_text().replace("batch_size: 2", "batch_sise: 2"))
    p = run_trainio("datagen", "--workload", wl, "--data-dir", tmpfs_dir / "d")
    assert f"{wl}: reader.batch_sise: not a key trainio reads; did you mean reader.batch_size?" in p.stderr
    s3 = tmpfs_dir / "s3.yaml"
    s3.write_text(wl.read_text() + "storage:\n  storage_type: s3\n")
    p = run_trainio("replay", "--workload", s3, "--data-dir", tmpfs_dir / "e", check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "storage.storage_root: missing" in p.stderr and not (tmpfs_dir / "e").exists()
    run_trainio("datagen", "--workload", s3, "--data-dir", tmpfs_dir / "e", "--param", "storage.storage_type=local_fs")
    assert (tmpfs_dir / "e" / "train").is_dir()
