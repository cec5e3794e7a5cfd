"""The package's layers: every import of `logra/` and `baselines/` (those inside functions too)
goes down the declared direction, the import graph has no cycle, and the analysis loads no
torch. The checks are shown to fail on a planted edge."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# layer -> the layers its modules may import besides its own (docs/architecture.md)
ALLOWED = {
    "shared": set(),        # logra.files, logra.common, logra.repro, logra.noise, logra.tracking
    "optim": set(),                                    # the algorithm a user imports: torch only
    "baselines": {"optim"},
    "rules": {"shared", "optim"},                      # the registry; rule modules load by path
    "api": {"optim"},                                  # logra/__init__.py: logra.LoGRAOptimizer
    "measure": {"shared", "optim", "rules"},
    "rl": {"shared", "optim", "rules", "measure"},
    "harness": {"shared", "optim", "rules", "measure", "rl"},
    "analysis": {"shared"},
}
SHARED = {"logra.files", "logra.common", "logra.repro", "logra.noise", "logra.tracking"}


def layer(module: str) -> str | None:
    """The layer of a project module, None for anything else (torch, the standard library)."""
    parts = module.split(".")
    if parts[0] == "baselines":
        return "baselines"
    if parts[0] != "logra":
        return None
    if module == "logra":
        return "api"
    if module in SHARED:
        return "shared"
    if module == "logra.rules":
        return "rules"
    return parts[1] if parts[1] in ALLOWED else None


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at its top and inside functions; `from a import b` counts
    as a.b where a.b is a module of the project, else as a."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if _is_module(sub) else node.module)
    return found


def _is_module(name: str) -> bool:
    base = ROOT / name.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def graph() -> dict[str, set[str]]:
    """module -> the project modules it imports, over logra/ and baselines/."""
    files = [p for d in ("logra", "baselines") for p in sorted((ROOT / d).rglob("*.py"))]
    g = {module_name(p): {m for m in imports(p) if layer(m)} for p in files}
    return {a: targets - {a} for a, targets in g.items()}  # rollout's __main__ imports itself


def against_the_direction(g: dict[str, set[str]]) -> list[str]:
    return [f"{a} ({layer(a)}) imports {b} ({layer(b)})" for a, targets in sorted(g.items())
            for b in sorted(targets)
            if layer(b) != layer(a) and layer(b) not in ALLOWED[layer(a)]]


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected set of modules that has one."""
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"
    for node in sorted(g):
        if node not in state:
            visit(node, [node])
    return found


def test_every_import_goes_down_the_layers_and_none_closes_a_cycle():
    g = graph()
    assert {"logra.optim.logra_rule", "logra.rl.loop", "logra.analysis.report",
            "logra.analysis.tables", "baselines.lora"} <= set(g)  # the walk reached every layer
    assert all(layer(m) for m in g), [m for m in g if not layer(m)]
    assert against_the_direction(g) == []
    assert cycles(g) == []


def test_a_planted_edge_is_caught():
    g = graph()
    assert against_the_direction(g | {"logra.optim.sketch": {"logra.rl.loop"}}) == [
        "logra.optim.sketch (optim) imports logra.rl.loop (rl)"]
    assert against_the_direction(g | {"logra.analysis.figures": {"logra.measure.planner"}})
    planted = g | {"logra.rl.guards": g["logra.rl.guards"] | {"logra.rl.loop"}}
    assert [set(c) for c in cycles(planted)] == [{"logra.rl.loop", "logra.rl.guards"}]


def test_inner_imports_count():
    code = "def f():\n    from logra.rl.loop import train\n    import logra.optim.sketch\n"
    path = ROOT / "tests" / "_planted_layer_probe.py"
    path.write_text(code)
    try:
        assert imports(path) == {"logra.rl.loop", "logra.optim.sketch"}
    finally:
        path.unlink()


def test_the_analysis_and_the_shared_modules_load_no_torch():
    code = ("import sys\nimport logra.analysis.report, logra.analysis.tables, "
            "logra.analysis.markdown, logra.analysis.memory_report, logra.analysis.runs_report, "
            "logra.analysis.figures, logra.analysis.verdict, logra.common, logra.files, "
            "logra.repro\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
