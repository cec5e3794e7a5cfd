"""`python -m logra.harness.adopt`: every grid's written choices into the one file the config
reads them from, each change printed; an unbracketed change refused unless asked; a file that
does not resolve never left behind."""
from pathlib import Path

import pytest
import yaml

from logra.harness.adopt import adopt, main
from logra.harness.config import ConfigError, resolve
from logra.harness.plan import build_plan

ROOT = Path(__file__).resolve().parents[2]


def sweep_record(scores: list, value: float, bracketed: bool, option: str = "lr") -> dict:
    """A record as the lr sweep and the scaling sweep write it (logra.analysis.tuning.choices)."""
    return {"option": option, "value": value, "bracketed": bracketed, "metric": "sampled",
            "seeds": [10, 11, 12], "scores": scores}


def study_record(arm: str, point: float) -> dict:
    """A record as the study writes it (results/study/tuned/<arm>_<horizon>.yaml, `arm` the
    arm at its horizon: logra.analysis.study.arm_choice), the point's method config as the
    plan derives it."""
    plan = build_plan(resolve([], fit_rules=False), fit_rules=False)
    name = next(n for n, (a, v) in plan.grids["study"][arm].points().items()
                if a == arm and v == point)
    seeds = plan.config["lr_sweep"]["seeds"]
    return {"option": "lr", "value": point, "bracketed": True, "metric": "sampled",
            "val_accuracy": 0.3, "by_seed": dict.fromkeys(seeds, 0.3),
            "scores": [[point / 2, 0.25], [point, 0.3], [point * 2, 0.2]],
            "config": plan.config["methods"][name]}


def write_results(results: Path, sweep: dict | None = None, study: dict | None = None,
                  scaling: dict | None = None) -> None:
    if scaling:
        (results / "scaling").mkdir(parents=True, exist_ok=True)
        (results / "scaling" / "tuned.yaml").write_text(yaml.safe_dump(scaling))
    if sweep:
        results.mkdir(parents=True, exist_ok=True)
        (results / "tuned.yaml").write_text(yaml.safe_dump({"tuned": {"countdown": sweep}}))
    for arm, record in (study or {}).items():
        (results / "study" / "tuned").mkdir(parents=True, exist_ok=True)
        (results / "study" / "tuned" / f"{arm}.yaml").write_text(yaml.safe_dump({arm: record}))


def test_each_kind_of_record_is_adopted_and_the_config_resolves_with_it(tmp_path, capsys):
    """An lr sweep's record, a study arm's and the scaling sweep's go into the file, each change
    printed, and the config read with it takes every value; adopting the same records again
    changes nothing."""
    galore = sweep_record([[1.25e-4, 0.31], [2.5e-4, 0.35], [5e-4, 0.33]], 2.5e-4, True)
    arm = study_record("dense_adam_study_h80", 5e-5)
    scaling = {"dense_adam": sweep_record([[1e-4, 0.3], [2e-4, 0.4], [4e-4, 0.3]], 2e-4, True),
               "logra": sweep_record([[5e-5, 0.3], [2e-4, 0.3], [8e-4, 0.4], [3.2e-3, 0.3]], 8e-4,
                                     True, "kl_budget")}
    write_results(tmp_path / "results", {"galore": galore}, {"dense_adam_study_h80": arm}, scaling)
    to = tmp_path / "adopted.yaml"
    assert main(["--results", str(tmp_path / "results"), "--to", str(to)]) == 0
    out = capsys.readouterr().out
    assert "tuned.countdown.galore: (new) lr 0.00025\n" in out
    assert "study.tuned.dense_adam_study_h80: (new) lr 5e-05\n" in out
    assert "scaling.tuned.logra: (new) kl_budget 0.0008\n" in out
    config = resolve([to], fit_rules=False)
    assert config["methods"]["galore"]["options"]["lr"]["countdown"] == 2.5e-4
    assert config["study"]["tuned"]["dense_adam_study_h80"] == arm
    plan = build_plan(config, fit_rules=False)  # the adopted arm's grid does not run
    assert not [r for r in plan.runs["study_sweep"] if "/dense_adam_study_h80_lr" in r]
    s0, s1 = list(plan.config["scaling"]["sizes"])[:2]  # the scaling grid at the adopted values
    assert plan.config["methods"][plan.scaling.grid["dense_adam", s0]]["options"]["lr"] == 2e-4
    assert plan.config["methods"][plan.scaling.grid["logra", s1]]["options"][
        "kl_budget"] == 8e-4
    text = to.read_text()
    assert adopt(tmp_path / "results", to) == [
        "tuned.countdown.galore: lr 0.00025 (unchanged)",
        "study.tuned.dense_adam_study_h80: lr 5e-05 (unchanged)",
        "scaling.tuned.dense_adam: lr 0.0002 (unchanged)",
        "scaling.tuned.logra: kl_budget 0.0008 (unchanged)"]
    assert to.read_text() == text


def test_a_choice_on_its_grids_edge_is_refused_unless_asked(tmp_path, capsys):
    """An unbracketed change writes nothing, naming the key; with --unbracketed it is adopted
    and printed as on the edge."""
    edge = sweep_record([[2.5e-4, 0.36], [5e-4, 0.35], [1e-3, 0.33]], 2.5e-4, False)
    write_results(tmp_path / "results", {"galore": edge})
    to = tmp_path / "adopted.yaml"
    args = ["--results", str(tmp_path / "results"), "--to", str(to)]
    assert main(args) == 1 and not to.exists()
    assert "tuned.countdown.galore: its choice is on its grid's edge" in capsys.readouterr().err
    assert main(args + ["--unbracketed"]) == 0
    assert "tuned.countdown.galore: (new) lr 0.00025, on its grid's edge" in \
        capsys.readouterr().out
    assert resolve([to], fit_rules=False)["methods"]["galore"]["options"]["lr"][
        "countdown"] == 2.5e-4


def test_a_record_its_grid_would_not_choose_leaves_the_file_as_it_was(tmp_path):
    """A record the config refuses (here: not the rule's choice among its own scores) restores
    the file and names the key."""
    to = tmp_path / "adopted.yaml"
    to.write_text("# as it was\ntuned: {}\n")
    wrong = sweep_record([[1.25e-4, 0.31], [2.5e-4, 0.35], [5e-4, 0.33]], 5e-4, True)
    write_results(tmp_path / "results", {"galore": wrong})
    with pytest.raises(ConfigError, match=r"tuned.countdown.galore.value: 0.0005 is not the "
                                          r"rule's choice among its scores"):
        adopt(tmp_path / "results", to)
    assert to.read_text() == "# as it was\ntuned: {}\n"


def test_nothing_written_is_an_error_naming_the_folder(tmp_path):
    with pytest.raises(ConfigError, match="no grid's choices"):
        adopt(tmp_path / "results", tmp_path / "adopted.yaml")


def test_only_one_grids_records_are_adopted_when_asked(tmp_path):
    """--only scaling leaves the lr sweep's record where both were written; --only with none
    of that kind written is the same error as nothing written."""
    galore = sweep_record([[1.25e-4, 0.31], [2.5e-4, 0.35], [5e-4, 0.33]], 2.5e-4, True)
    dense = sweep_record([[1e-4, 0.3], [2e-4, 0.4], [4e-4, 0.3]], 2e-4, True)
    write_results(tmp_path / "results", {"galore": galore}, scaling={"dense_adam": dense})
    to = tmp_path / "adopted.yaml"
    assert main(["--results", str(tmp_path / "results"), "--to", str(to), "--only",
                 "scaling"]) == 0
    assert set(yaml.safe_load(to.read_text())) == {"scaling"}
    with pytest.raises(ConfigError, match="no grid's choices"):
        adopt(tmp_path / "results", to, only="study")


def test_the_committed_file_is_what_adopting_it_again_writes(tmp_path):
    """config/tuned.yaml is the adopt command's own output: its records adopted again into a
    copy leave it byte for byte (so an edit by hand shows as a change)."""
    committed = yaml.safe_load((ROOT / "config/tuned.yaml").read_text())
    write_results(tmp_path / "results", committed["tuned"]["countdown"],
                  committed["study"]["tuned"], committed["scaling"]["tuned"])
    copy = tmp_path / "tuned.yaml"
    copy.write_text((ROOT / "config/tuned.yaml").read_text())
    lines = adopt(tmp_path / "results", copy)
    assert lines and all(line.endswith("(unchanged)") for line in lines)
    assert copy.read_text() == (ROOT / "config/tuned.yaml").read_text()
