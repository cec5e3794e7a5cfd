"""Atomic outputs: an interrupted write leaves no file a reader would take as complete."""
import pytest

from logra.io import atomic_path, write_json


def test_failed_write_leaves_nothing_and_keeps_the_old_result(tmp_path):
    path = tmp_path / "out" / "result.json"
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text('{"half": ')
            raise RuntimeError("killed mid-write")
    assert list((tmp_path / "out").iterdir()) == []
    write_json(path, {"accuracy": 0.5})
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text("garbage")
            raise RuntimeError
    assert path.read_text() == '{\n "accuracy": 0.5\n}'
    assert [p.name for p in path.parent.iterdir()] == ["result.json"]


def test_directory_replaces_the_old_one_and_clears_a_stale_temp(tmp_path):
    out = tmp_path / "model"
    stale = tmp_path / ".model.tmp"  # left by a writer killed with SIGKILL
    stale.mkdir()
    (stale / "half.bin").write_bytes(b"x")
    for content in ("old", "new"):
        with atomic_path(out) as tmp:
            tmp.mkdir()
            (tmp / "weights.txt").write_text(content)
    assert [p.name for p in out.iterdir()] == ["weights.txt"]
    assert (out / "weights.txt").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
