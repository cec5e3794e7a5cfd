import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from logra.repro import pin_cpu  # noqa: E402  (imports no torch)

pin_cpu()  # before torch loads: the tests, and every process they start, compute as CPU jobs do

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A small random llama-architecture model + char tokenizer saved in HF format."""
    from logra.modeling import build_tiny
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", hidden_size=64,
                      intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
