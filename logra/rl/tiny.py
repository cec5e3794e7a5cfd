"""A tiny model's shape: its character vocabulary and the checks its options must pass.

Apart from `logra.rl.models` (which builds the model) so that the config's checks, which run
in every Snakemake invocation, need no transformers: `tiny_shape` is the HF config's keyword
arguments, checked; `logra.rl.models.tiny_config` builds the config from them.
"""
from __future__ import annotations

import string

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>"]
CHARSET = "\n" + "".join(c for c in string.printable if c.isprintable())  # 95 printable + newline
POSITIONS = 256  # a tiny model's context unless told (the workflow sizes it per task)
ARCHITECTURES = {"qwen2": "Qwen2Config", "llama": "LlamaConfig"}  # transformers' config classes


def tiny_shape(*, architecture: str = "llama", hidden_size: int = 256,
               intermediate_size: int = 512, num_hidden_layers: int = 2,
               num_attention_heads: int = 4, num_key_value_heads: int | None = None,
               max_position_embeddings: int = POSITIONS, tie_word_embeddings: bool = False,
               vocab_size: int | None = None) -> tuple[str, dict]:
    """(architecture, the keyword arguments of its HF config) of a tiny decoder over the
    character vocabulary (`vocab_size`: a larger one, for memory measurements at a real model's
    vocabulary size; token ids beyond the characters mean nothing). A ValueError names the
    option that does not fit; an unknown option is a TypeError."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"model.architecture: unknown {architecture!r}; "
                         f"known: {sorted(ARCHITECTURES)}")
    if hidden_size % num_attention_heads:
        raise ValueError(f"model.hidden_size={hidden_size} is not divisible by "
                         f"model.num_attention_heads={num_attention_heads}")
    if num_key_value_heads and num_attention_heads % num_key_value_heads:
        raise ValueError(f"model.num_attention_heads={num_attention_heads} is not divisible by "
                         f"model.num_key_value_heads={num_key_value_heads} (each key-value head "
                         "serves a whole group of query heads)")
    pad, eos = SPECIAL_TOKENS.index("<pad>"), SPECIAL_TOKENS.index("<eos>")
    return architecture, dict(
        vocab_size=vocab_size or len(SPECIAL_TOKENS) + len(CHARSET), hidden_size=hidden_size,
        intermediate_size=intermediate_size, num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads or num_attention_heads,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=tie_word_embeddings,
        pad_token_id=pad, eos_token_id=eos, bos_token_id=eos)
