"""Fail unless the GPU pin set (requirements-gpu.txt) resolves against PyPI with pip's own
resolver, metadata only, to the CUDA build of the pinned torch and to every pinned version.

    python .ci/gpu_pins.py

`pip install --dry-run --report` resolves without installing. `--isolated` ignores pip's
configuration and environment (a local folder of CPU wheels among them) and `--index-url`
names PyPI alone, so torch==2.13.0 resolves as on a GPU machine: to PyPI's manylinux wheel,
the CUDA build, whose metadata requires the nvidia-* CUDA libraries.
"""
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line, following `-r` includes."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            out |= pins(path.parent / line[3:].strip())
        elif "==" in line:
            name, version = line.split("==")
            out[re.sub(r"[-_.]+", "-", name).lower()] = version
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run",
               "--ignore-installed", "--quiet", "--index-url", "https://pypi.org/simple",
               "--report", str(report), "-r", str(ROOT / "requirements-gpu.txt")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"GPU pin set does not resolve:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        resolved = {re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower(): i
                    for i in json.loads(report.read_text())["install"]}
    wrong = {name: resolved.get(name, {}).get("metadata", {}).get("version")
             for name, version in pins(ROOT / "requirements-gpu.txt").items()
             if resolved.get(name, {}).get("metadata", {}).get("version") != version}
    if wrong:
        sys.exit(f"GPU pin set resolved to other versions than pinned: {wrong}")
    torch = resolved["torch"]
    cuda = [r for r in torch["metadata"].get("requires_dist", []) if r.startswith("nvidia-")]
    if not cuda or "+cpu" in torch["metadata"]["version"]:
        sys.exit(f"torch resolved to a CPU build: {torch['download_info']['url']}")
    print(f"GPU pin set resolves: {len(resolved)} packages, vllm "
          f"{resolved['vllm']['metadata']['version']}, torch {torch['metadata']['version']} "
          f"(CUDA build: {len(cuda)} nvidia-* requirements), transformers "
          f"{resolved['transformers']['metadata']['version']}")


if __name__ == "__main__":
    main()
