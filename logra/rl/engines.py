"""The rollout engine a config names (`rollout.engine`): `hf`, logra/rl/rollout.py's
`HFRolloutEngine`, or `vllm`, logra/rl/vllm_engine.py's `VLLMRolloutEngine`, whose module (and
vLLM) is imported only when named. A module of its own: each engine's module imports the
interface from logra/rl/rollout.py, and this one imports them."""
from __future__ import annotations

from logra.rl.rollout import HFRolloutEngine


def engine_class(name: str) -> type:
    """The engine class of a config name (`rollout.engine`)."""
    if name == "hf":
        return HFRolloutEngine
    if name == "vllm":
        from logra.rl.vllm_engine import VLLMRolloutEngine
        return VLLMRolloutEngine
    raise ValueError(f"rollout.engine: unknown {name!r}; known: ['hf', 'vllm']")


def make_engine(name: str, model_dir: str, **options):
    """Engine by config name (`rollout.engine`), started on the weights in `model_dir`."""
    return engine_class(name)(model_dir, **options)
