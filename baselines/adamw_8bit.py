"""8-bit AdamW through the method interface: `torchao.optim.AdamW8bit`, on every weight.

torchao's AdamW8bit keeps both moments block-wise quantized (Dettmers et al. 2022's dynamic
tree code). It runs on CPU and on GPUs alike (each parameter's update is one `torch.compile`d
function). Chosen because the same code runs on the CPU here and on GPUs. The rule compiles
every update before the first step (`compile_ahead`, in its constructor): on CPU a run's step 1
is measured under torch's memory profiler, which records the compiler's own work too.
`state_tensors` counts a quantized state by its codes, scales and code table. With bf16 weights
without a float32 copy, `bf16_stochastic_round` rounds each updated weight to bf16 stochastically.
weight_decay defaults to 0, as every rule here (torchao's own default is 0.01); it runs through
`baselines.torch_optimizer.TorchOptimizerRule`.

Details (compiling ahead, which tensors are quantized, stochastic rounding): docs/adamw_8bit.md.
"""
from __future__ import annotations

import math

import torch

from baselines.torch_optimizer import TorchOptimizerRule
from logra.optim.rule import ADAM_OPTIONS, POSINT, Geometry

MIN_NUMEL = 4096  # torchao quantizes tensors at least this large (torchao.optim.adam)
CODES = 256       # entries of a quantized tensor's code table (fp32)


class AdamW8bit(TorchOptimizerRule):
    options = {**ADAM_OPTIONS, "block_size": POSINT | {
        "description": "weights per quantization block (one fp32 scale per block and moment)"},
        "bf16_stochastic_round": {"type": "boolean", "description": "round each updated bf16 "
                                  "weight stochastically (needs grpo.param_dtype: bfloat16)"}}
    shardable = False  # torchao supports DTensor; not verified here

    def __init__(self, model: torch.nn.Module, lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, block_size: int = 256,
                 bf16_stochastic_round: bool = False):
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        wide = sorted({str(p.dtype) for _, p in self.named if p.dtype != torch.bfloat16})
        if bf16_stochastic_round and wide:
            raise ValueError(f"adamw_8bit: bf16_stochastic_round rounds bf16 weights; these are "
                             f"{', '.join(wide)} (set the method's grpo.param_dtype: bfloat16)")
        hyper = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                     block_size=block_size, bf16_stochastic_round=bf16_stochastic_round)
        self.optimizer = _torchao_adamw8bit()([p for _, p in self.named], **hyper)
        cuda = sorted({p.device for _, p in self.named if p.device.type == "cuda"}, key=str)
        with torch.random.fork_rng(devices=cuda):  # the throwaway steps draw none of the run's
            self.compile_ahead(hyper)

    def compile_ahead(self, hyper: dict) -> None:
        """Compile torchao's update for each (shape, dtype, device) of the trained weights: one
        step of a throwaway optimizer with the same hyperparameters, on one zero weight and
        zero gradient at a time. The real first step then finds every graph compiled (the
        compiled function is torchao's module-level one; its guards see the same argument
        types and constants). The trained weights and this optimizer's state are untouched."""
        for shape, dtype, device in {(p.shape, p.dtype, p.device) for _, p in self.named}:
            if device.type == "meta":
                continue
            dummy = torch.nn.Parameter(torch.zeros(shape, dtype=dtype, device=device))
            dummy.grad = torch.zeros_like(dummy)
            with _fp32(device):
                _torchao_adamw8bit()([dummy], **hyper).step()

    def propose(self) -> None:
        with _fp32(self.named[0][1].device if self.named else torch.device("cpu")):
            super().propose()

    @staticmethod
    def planned(geo: Geometry, options: dict, b: int) -> dict:
        """Per weight tensor of n elements: when quantized (n ≥ 4096 and a multiple of the
        block size B), 2 bytes (one uint8 code per moment) per weight, 2·n/B fp32 block scales
        and two 256-entry fp32 code tables; otherwise two fp32 moments; and a 0-d fp32 step
        count. Every weight's gradient until step(); inside step() two fp32 tensors of the
        largest weight's size (the dequantized moments it updates). With
        `bf16_stochastic_round` the weights are bf16 with no fp32 copy, and their gradients
        and unquantized moments bf16 (the policy's `b` bytes each)."""
        f, block = 4, options.get("block_size", 256)
        pure = options.get("bf16_stochastic_round", False)
        return {"weights": geo.n_all * b, "master": geo.n_all * f if b < f and not pure else 0,
                "grads": geo.n_all * (b if pure else f),
                "optimizer": sum(state_bytes(math.prod(s), block, b if pure else f)
                                 for _, s in geo.params),
                "step": 0, "perturbed_copy": 0, "after_apply": 0,
                "transient": 2 * geo.largest * f, "frozen_base": False}


def _torchao_adamw8bit() -> type[torch.optim.Optimizer]:
    """torchao's AdamW8bit, imported when a rule is built: the config check reads `options`
    without loading torchao."""
    from torchao.optim import AdamW8bit
    return AdamW8bit


def _fp32(device: torch.device):
    """Autocast off on `device`: the global state every update is compiled and run under."""
    return torch.autocast(device.type, enabled=False)


def quantized(numel: int, block: int) -> bool:
    return numel >= MIN_NUMEL and numel % block == 0


def state_bytes(numel: int, block: int, weight_bytes: int = 4) -> int:
    """Bytes of one weight tensor's AdamW8bit state: its two moments (unquantized ones in the
    weight's dtype, `weight_bytes` each) and its step count."""
    moments = (2 * (numel + numel // block * 4 + CODES * 4) if quantized(numel, block)
               else 2 * numel * weight_bytes)
    return moments + 4
