"""The workflow's rule files share only the plan: a global that one `workflow/rules/*.smk`
defines is read by no other file of the workflow (the Snakefile included). The Snakefile
builds PLAN (logra/harness/plan.py) and `workflow/rules/common.smk` holds the glue every rule
file shares; each other file's globals are its own."""
import re

from conftest import ROOT

RULES = ROOT / "workflow" / "rules"


def _defined(text: str) -> set[str]:
    """The top-level names a rule file assigns or defines."""
    return set(re.findall(r"^([A-Za-z_]\w*)\s*=(?!=)", text, re.M)) | set(
        re.findall(r"^def (\w+)", text, re.M))


def shared_globals(files: dict[str, str]) -> list[str]:
    """"<reader>: <name> (defined in <file>)" for every global of one rule file (not
    common.smk, nor the Snakefile, whose PLAN every file reads) that another file reads."""
    return [f"{reader}: {name} (defined in {owner})"
            for owner, text in files.items() if owner not in ("common.smk", "Snakefile")
            for name in sorted(_defined(text))
            for reader, other in files.items()
            if reader != owner and re.search(rf"\b{name}\b", other)]


def test_no_rule_file_reads_a_global_another_defines():
    files = {p.name: p.read_text() for p in sorted(RULES.glob("*.smk"))}
    files["Snakefile"] = (ROOT / "Snakefile").read_text()
    assert "common.smk" in files
    assert not shared_globals(files)


def test_the_check_finds_a_shared_global():
    files = {"a.smk": "RUNS = []\n\n\ndef helper(w):\n    return w\n",
             "b.smk": "rule x:\n    input: expand('{r}', r=RUNS), helper\n",
             "common.smk": "def glue(w):\n    return w\n", "c.smk": "LOCAL = glue\n"}
    assert shared_globals(files) == ["b.smk: RUNS (defined in a.smk)",
                                     "b.smk: helper (defined in a.smk)"]
