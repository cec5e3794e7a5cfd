"""Third-party messages that say nothing about a run, each dropped where it is emitted: by the
logger (or, for a warning, the module) and the message; everything else passes. `quiet()`
installs the filters; the code that imports or builds those packages calls it first (the rule
registry, logra.rl.models, the lm-eval and TRL harnesses), so the console shows the workflow's
own lines."""
from __future__ import annotations

import logging
import re
import warnings

# (logger, message pattern, why it is harmless here)
LOG_NOISE = (
    ("torchao", r"Failed to load .*torchao/_C_",
     "torchao's CUDA kernels (mxfp8, cutlass) on a CPU build of torch; its 8-bit AdamW is torch"),
    ("torch.utils._pytree", r"is an Enum subclass and is now natively supported by torch.compile",
     "torchao registers its enums through an API torch deprecates, once per process"),
    ("bitsandbytes.backends.cpu.ops", r"Failed to load CPU gemm_4bit_forward",
     "bitsandbytes' 4-bit kernels (imported by peft); no weight here is 4-bit"),
)
# (module that warns, message pattern, category, why it is harmless here)
WARNING_NOISE = (
    ("galore_torch.adamw", r"This implementation of AdamW is deprecated", FutureWarning,
     "galore-torch's own AdamW, the official GaLore optimizer, warns on every construction"),
)


class _Drop(logging.Filter):
    """Drops a logger's records whose message matches `pattern`."""

    def __init__(self, pattern: str):
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


def quiet() -> None:
    """Install the filters of LOG_NOISE and WARNING_NOISE (once per process; the loggers need
    not exist yet)."""
    for name, pattern, _ in LOG_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.pattern.pattern == pattern for f in logger.filters):
            logger.addFilter(_Drop(pattern))
    for module, pattern, category, _ in WARNING_NOISE:
        warnings.filterwarnings("ignore", message=pattern, category=category, module=module)
