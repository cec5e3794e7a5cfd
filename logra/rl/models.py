"""Models and tokenizers: tiny ones built locally, real ones loaded by name.

On this CPU machine nothing is downloaded: `build_tiny` creates a Qwen2- or Llama-architecture
decoder of a configurable size and a character-level tokenizer (built with `tokenizers`, wrapped
as a `PreTrainedTokenizerFast`), and saves both in Hugging Face format. Everything downstream
(SFT, GRPO, the rollout engine, lm-eval) then loads them with `load`, which is the same
`from_pretrained` path a hub model name takes on a GPU cluster.

The character vocabulary is printable ASCII plus newline; anything else maps to `<unk>`. A
completion ends with the `<eos>` token, which is also the padding token's neighbour rather than
the padding token itself, so that padded positions are never mistaken for a stop.

Deviation, for start-up time: transformers' model code imports three packages this harness
never uses through it, about 2 s of every job's start-up: scikit-learn (with scipy.stats) for
assisted decoding's confidence threshold (`roc_curve`), scipy.optimize for object-detection
losses, and torchao for loading torchao-quantized checkpoints. This module, which the harness's
jobs import before transformers' models, loads that code with the three hidden
(`extras_hidden`): in such a process transformers treats them as not installed, so those three
features are off. The packages themselves import as usual afterwards (torchao's 8-bit AdamW,
lm-eval's metrics); a process that loaded transformers' model code first is unchanged.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


EXTRAS = ("sklearn", "scipy", "torchao")  # what transformers' model code needs no more of


def extras_hidden() -> None:
    """Load transformers' model code (`modeling_utils`) and generation with `EXTRAS` hidden (the
    module docstring), once per process, unless it is loaded already."""
    if {"transformers.modeling_utils", "transformers.generation.candidate_generator"} & set(
            sys.modules):
        return
    from transformers.utils import import_utils
    hidden = [name for name in EXTRAS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # find_spec and import both answer "not installed"
    for check in (import_utils.is_sklearn_available, import_utils.is_scipy_available,
                  import_utils.is_torchao_available):
        check.cache_clear()  # asked again now, and the answer kept: what the import saw
    try:
        import transformers.generation.candidate_generator  # noqa: F401
        import transformers.modeling_utils  # noqa: F401
    finally:
        for name in hidden:
            del sys.modules[name]


extras_hidden()  # before transformers' models load, below

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as transformers_logging  # noqa: E402

from logra.noise import quiet
from logra.rl.tiny import ARCHITECTURES, CHARSET, SPECIAL_TOKENS, tiny_shape

quiet()  # transformers imports torchao when it builds, saves or loads a model (logra/noise.py)
# transformers' own "Loading weights" / "Writing model shards" bars, one per model a job builds,
# loads or saves, reach the console past the job's log (the hub's download bars stay)
transformers_logging.disable_progress_bar()


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character, `<eos>` closes a completion."""
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + list(CHARSET))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left",
                                   model_max_length=1024)


def tiny_config(**options):
    """The HF config of a tiny decoder (`logra.rl.tiny.tiny_shape(**options)`, which checks
    them)."""
    architecture, kwargs = tiny_shape(**options)
    return getattr(transformers, ARCHITECTURES[architecture])(**kwargs)


def build_tiny(out_dir: str | Path, *, seed: int = 0, **options) -> Path:
    """Create a randomly initialised decoder (`tiny_config(**options)`) + char tokenizer and
    save both to `out_dir`."""
    config = tiny_config(**options)
    tokenizer = char_tokenizer()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def model_config(model: dict):
    """The HF config the `model` section of the run config describes (no weights loaded)."""
    if model["name"] == "tiny":
        return tiny_config(**model.get("tiny", {}))
    return AutoConfig.from_pretrained(model["name"])


def context_needed(tokenizer, task, examples, room: int) -> int:
    """Positions a model needs for `examples` of `task`: the longest prompt + target + `<eos>` in
    `tokenizer`'s tokens, plus `room` tokens to generate (`logra.harness.config.generation_room`).
    lm-eval keeps a prompt's last max_position_embeddings - max_gen_toks tokens, so with this many
    no prompt of these examples is cut."""
    return room + max(len(tokenizer(task.prompt(e) + task.target(e)).input_ids) + 1
                      for e in examples)


def check_context(hf_config, needed: int, task: str, model: str) -> None:
    """Stop, naming the task, when `model` (its HF config) holds fewer than `needed` positions
    (`context_needed`)."""
    have = getattr(hf_config.get_text_config(), "max_position_embeddings", None)
    if have is not None and have < needed:
        raise ValueError(f"tasks.{task}: its longest prompt + completion plus generation room "
                         f"needs {needed} positions; model {model} holds "
                         f"max_position_embeddings={have} (shorten the task's examples, lower "
                         "grpo.max_new_tokens / eval.max_gen_toks, or choose another model)")


def load(name_or_path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Load (model, tokenizer) from a local directory or a hub name (same code path).

    Errors name what is missing: a local model directory without tokenizer files is reported
    as such rather than as a hub lookup failure.
    """
    path = Path(name_or_path)
    if path.exists():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path}: not a model directory (no config.json)")
        if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer.model",
                                                 "vocab.json")):
            raise FileNotFoundError(f"{path}: model directory has no tokenizer "
                                    "(tokenizer.json / tokenizer.model / vocab.json)")
    # transformers maps some model types (qwen2) to their hub tokenizer class regardless of
    # tokenizer_config.json; a tokenizer saved as a generic fast tokenizer is loaded as one.
    tok_cfg = path / "tokenizer_config.json"
    generic = tok_cfg.exists() and json.loads(tok_cfg.read_text()).get("tokenizer_class") in (
        "TokenizersBackend", "PreTrainedTokenizerFast")
    tokenizer = (PreTrainedTokenizerFast if generic else AutoTokenizer).from_pretrained(
        str(name_or_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=dtype).to(device)
    return model, tokenizer


def n_params(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def median_abs_weight(model: torch.nn.Module) -> float:
    """Median |w| over every weight of `model` (each parameter once): the scale an lr is
    compared with (a step of ±lr per weight changes a bf16 word when lr is near |w| / 256)."""
    return torch.cat([p.detach().abs().flatten().float() for p in model.parameters()]
                     ).median().item()
