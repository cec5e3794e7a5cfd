"""Atomic outputs: an interrupted write leaves no file a reader would take as complete."""
import pytest

from logra.files import atomic_path, write_json


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


def test_a_directory_replaces_a_file_and_a_symlink_is_replaced_not_followed(tmp_path):
    out, target = tmp_path / "model", tmp_path / "elsewhere"
    out.write_text("an old file")
    with atomic_path(out) as tmp:
        tmp.mkdir()
        (tmp / "w").write_text("dir")
    assert (out / "w").read_text() == "dir"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target)
    write_json(link, {"a": 1})
    assert not link.is_symlink() and link.read_text() == '{\n "a": 1\n}'
    assert (target / "keep").exists()  # what the symlink pointed to is untouched


def test_progress_is_one_line_on_the_console_and_in_the_log(tmp_path, capfd):
    """A job's progress line reaches the console (the process's stderr) even while the script
    redirects stdout and stderr into its log, and the log gets it too."""
    from contextlib import redirect_stderr, redirect_stdout

    from logra.files import mib, progress
    with open(tmp_path / "job.log", "w") as log, redirect_stdout(log), redirect_stderr(log):
        line = progress("train a/logra/seed1", "ok", steps=80, reward=0.43812, peak=mib(3 * 2**20),
                        accuracy=None)
    assert line == "train a/logra/seed1: ok, steps 80, reward 0.438, peak 3.0 MiB, accuracy n/a"
    assert (tmp_path / "job.log").read_text() == line + "\n"
    assert capfd.readouterr().err == line + "\n"


def test_a_ticker_reports_while_a_job_runs_not_more_often_than_asked(capfd, monkeypatch):
    """`ticker`: a line when `every_s` has passed since the last, none at the last step (the
    job's own line follows), the ETA from this process's steps."""
    import logra.files
    from logra.files import ticker
    clock = iter(range(0, 1000, 10))  # each call of the clock: 10 s later
    monkeypatch.setattr(logra.files.time, "monotonic", lambda: next(clock))
    tick = ticker("train a/logra/seed1", total=8, every_s=25)  # starts at 0 s
    for step in range(5, 9):  # resumed at step 5: 10, 20, 30, 40 s
        tick(step, reward=0.5)
    assert capfd.readouterr().err.splitlines() == [
        "train a/logra/seed1: step 7/8, elapsed 30 s, ETA 10 s, reward 0.5"]


def test_known_noise_is_dropped_by_logger_and_message_only(caplog):
    """`logra.noise.quiet`: a known message is dropped at its logger; the same logger's other
    messages, and the same text from another logger, pass."""
    import logging

    from logra.noise import quiet
    quiet()
    quiet()  # once per process: a second call adds nothing
    assert len(logging.getLogger("torchao").filters) == 1
    with caplog.at_level(logging.WARNING):
        logging.getLogger("torchao").warning("Failed to load /x/torchao/_C_mxfp8.so: no CUDA")
        logging.getLogger("torchao").warning("Failed to load something else")
        logging.getLogger("mine").warning("Failed to load /x/torchao/_C_mxfp8.so: no CUDA")
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("torchao", "Failed to load something else"),
        ("mine", "Failed to load /x/torchao/_C_mxfp8.so: no CUDA")]
