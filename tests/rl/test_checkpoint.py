"""Checkpoint digests parse strictly (logra/rl/checkpoint.py): one SHA-256 in hex, either case,
then the file's name; any other digest file is a corrupt checkpoint, which the run's
grpo.on_bad_checkpoint handles, never an IndexError or a UnicodeDecodeError."""
import pytest
import torch

from logra.rl import checkpoint
from logra.rl.checkpoint import CorruptCheckpoint


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "state.pt"
    checkpoint.save(path, {"cfg": {}, "model": {"w": torch.ones(2)}})
    return path


def test_a_saved_checkpoint_verifies_and_reads(saved):
    assert torch.equal(checkpoint.read(saved)["model"]["w"], torch.ones(2))


def test_an_uppercase_digest_of_the_right_bytes_verifies(saved):
    digest = checkpoint.digest_path(saved)
    digest.write_text(digest.read_text().upper().replace("STATE.PT", "state.pt"))
    checkpoint.verify(saved)


@pytest.mark.parametrize("content", [
    b" \n",                                    # a whitespace line
    b"\xff\xfe",                               # not text
    b"",                                       # empty
    b"abc  state.pt\n",                        # not a SHA-256
    b"%s\n" % (b"0" * 64),                     # no file name
])
def test_a_digest_file_that_does_not_parse_is_a_corrupt_checkpoint(saved, content):
    checkpoint.digest_path(saved).write_bytes(content)
    with pytest.raises(CorruptCheckpoint, match=r"state.pt: corrupt digest file state.pt.sha256"):
        checkpoint.verify(saved)


def test_saving_over_a_corrupt_digest_file_writes_a_good_one(saved):
    checkpoint.digest_path(saved).write_bytes(b"\xff\xfe")
    checkpoint.save(saved, {"cfg": {}, "model": {"w": torch.zeros(2)}})
    assert torch.equal(checkpoint.read(saved)["model"]["w"], torch.zeros(2))
    assert len(checkpoint.digest_path(saved).read_text().splitlines()) == 1
