"""What torchrun starts on each rank in tests/test_distributed.py: `logra.rl.loop`'s command line,
with the test task of tests/test_resume.py registered first."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import test_resume  # noqa: E402,F401  (registers the digit-fraction task)

from logra.rl.loop import main

main()
