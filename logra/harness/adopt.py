"""Adopt the grids' choices into the config: one command for every grid.

    python -m logra.harness.adopt [--results results] [--to config/tuned.yaml] [--unbracketed]
                                  [--only tuned|study|scaling] [--dry-run] [--configfile FILE ...]

Each grid writes its choices on the validation split as records of one shape (the knob
`option`, its chosen `value`, `bracketed`, the `metric` and every point's `scores`, each grid
adding what its plan reads): the lr sweep results/tuned.yaml (`tuned.<task>.<method>`), the
study results/study/tuned/<arm>_<horizon>.yaml (`study.tuned.<arm>_<horizon>`), the scaling
sweep results/scaling/tuned.yaml (`scaling.tuned.<method>`). This copies every record written
under `--results` into `--to`, by default config/tuned.yaml, the file the config reads adopted
choices from (after config/config.yaml: logra.harness.config.resolve), and keeps the records no
grid wrote. It prints each record's change; a changed choice on its grid's edge (`bracketed:
false`) is refused unless `--unbracketed` (the bracket rule extends such a grid:
lr_sweep.extend). The file written must resolve into a plan under the config the workflow runs
(config/config.yaml, its tuned.yaml, the `--configfile` overlays the grids ran with, then `--to`
if it is another file), each record checked against its grid
(logra.harness.checks.check_choice); else the file is left as it was and the error names the
key. A record keeps its run's identity: a run's config holds the value, never the record.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from logra.files import atomic_path
from logra.harness.config import DEFAULT, ConfigError, read_yaml, resolve
from logra.harness.plan import build_plan

HEAD = ("# The adopted choices of every grid on the validation split, the records as each grid\n"
        "# wrote them (results/tuned.yaml: tuned.<task>.<method>; results/study/tuned/\n"
        "# <arm>_<horizon>.yaml: study.tuned.<arm>_<horizon>; results/scaling/tuned.yaml:\n"
        "# scaling.tuned.<method>), read after config/config.yaml. Written by\n"
        "# `python -m logra.harness.adopt` (logra/harness/adopt.py); not edited by hand.\n")


def written(results: Path) -> dict[tuple[str, ...], dict]:
    """Every record the grids wrote under `results`, by its key in the config."""
    out = {}
    sweep = results / "tuned.yaml"
    if sweep.exists():
        for task, chosen in (read_yaml(sweep).get("tuned") or {}).items():
            out |= {("tuned", task, method): r for method, r in chosen.items()}
    for path in sorted((results / "study" / "tuned").glob("*.yaml")):
        out |= {("study", "tuned", arm): r for arm, r in read_yaml(path).items()}
    scaling = results / "scaling" / "tuned.yaml"
    if scaling.exists():
        out |= {("scaling", "tuned", method): r for method, r in read_yaml(scaling).items()}
    return out


def _get(tree: dict, key: tuple[str, ...]) -> dict | None:
    for k in key:
        tree = (tree or {}).get(k)
    return tree


def _put(tree: dict, key: tuple[str, ...], record: dict) -> None:
    for k in key[:-1]:
        tree = tree.setdefault(k, {})
    tree[key[-1]] = record


def _what(record: dict) -> str:
    return f"{record.get('option')} {record.get('value')!r}"


def adopt(results: Path, to: Path, unbracketed: bool = False, dry_run: bool = False,
          configfiles: list[Path] = (), config: Path = DEFAULT, only: str | None = None
          ) -> list[str]:
    """Adopt every record under `results` into `to` (module docstring), or those of one grid
    kind (`only`: the first key, tuned, study or scaling); the lines it prints, one per
    record. Raises ConfigError, writing nothing, for an unbracketed change without
    `unbracketed` or a file that does not resolve (`config`, then `configfiles`; `to` is read
    after `config` as its tuned.yaml, or else as the last overlay)."""
    records = {k: r for k, r in written(results).items() if only in (None, k[0])}
    if not records:
        raise ConfigError(f"{results}: no grid's choices (results/tuned.yaml, results/study/"
                          "tuned/*.yaml, results/scaling/tuned.yaml): run the lr_sweep, study "
                          "or scaling_sweep target first")
    old_text = to.read_text() if to.exists() else None
    tree = read_yaml(to) if old_text is not None else {}
    lines, refused = [], []
    for key, record in records.items():
        name, before = ".".join(key), _get(tree, key)
        if before == record:
            lines.append(f"{name}: {_what(record)} (unchanged)")
            continue
        edge = "" if record.get("bracketed") else ", on its grid's edge"
        lines.append(f"{name}: " + (f"{_what(before)} -> " if before else "(new) ")
                     + _what(record) + edge)
        if edge and not unbracketed:
            refused.append(name)
        _put(tree, key, record)
    if refused:
        raise ConfigError("\n".join(
            f"{name}: its choice is on its grid's edge (bracketed: false): extend the grid "
            "(lr_sweep.extend) and run it again, or adopt it as it is with --unbracketed"
            for name in refused))
    if dry_run:
        return lines
    with atomic_path(to) as tmp:
        tmp.write_text(HEAD + yaml.safe_dump(tree, sort_keys=False, width=100,
                                             default_flow_style=None))
    try:  # the config as the next `snakemake` reads it
        beside = to.resolve() == Path(config).resolve().with_name("tuned.yaml")
        build_plan(resolve([*configfiles, *([] if beside else [to])], default=config,
                           fit_rules=False), fit_rules=False)
    except ConfigError:
        if old_text is None:
            to.unlink()
        else:
            to.write_text(old_text)
        raise
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m logra.harness.adopt",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=Path("results"),
                   help="the results folder the grids wrote (default: results)")
    p.add_argument("--to", type=Path, default=DEFAULT.with_name("tuned.yaml"),
                   help="the file adopted choices go to (default: config/tuned.yaml)")
    p.add_argument("--unbracketed", action="store_true",
                   help="adopt a changed choice on its grid's edge too")
    p.add_argument("--only", choices=["tuned", "study", "scaling"],
                   help="adopt one grid's records: the lr sweep's (tuned), the study's, the "
                        "scaling sweep's")
    p.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    p.add_argument("--configfile", type=Path, nargs="+", default=[],
                   help="the overlays the grids ran with, as given to snakemake")
    a = p.parse_args(argv)
    try:
        lines = adopt(a.results, a.to, a.unbracketed, a.dry_run, a.configfile, only=a.only)
    except ConfigError as e:
        print(f"adopt: nothing written: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    print(("would adopt" if a.dry_run else "adopted") + f" {len(lines)} records into {a.to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
