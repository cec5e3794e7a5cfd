"""What torchrun starts on each rank in tests/e2e/test_distributed.py: `logra.rl.loop`'s command
line, with the test tasks of tests/runs.py registered first."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
import runs  # noqa: E402,F401  (registers the digit-fraction task)

from logra.rl.loop import main

main()
