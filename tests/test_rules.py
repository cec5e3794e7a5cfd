"""Every registered update rule keeps the method interface (logra/optim/rule.py), and a rule is one
module: nothing outside it compares against its name, and a new rule runs from its own file."""
import ast
import inspect
import io
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml
from conftest import ROOT
from transformers import AutoModelForCausalLM

from logra import rules
from logra.optim.rule import DEFAULT_MODULES, UpdateRule
from logra.rl.loss import ESTIMATORS
from logra.rl.models import load
from logra.rl.weight_sync import apply_payload

PROMPTS = ["Q: 12+3\nA: 15", "Q: 4+4\nA: 8"]
# small options that make every rule change its basis or projection within the test's steps
OPTIONS = {"dense_adam": {"lr": 1e-2}, "logra": {"rank": 2, "update_ratio": 1e-2},
           "sketch_adam": {"lr": 1e-2, "rank": 2, "refresh_every": 2},
           "galore": {"lr": 1e-2, "rank": 2, "update_proj_gap": 2}, "lora": {"lr": 1e-2, "rank": 2},
           "apollo": {"lr": 1e-2, "rank": 2, "update_proj_gap": 2},
           "adam_mini": {"lr": 1e-2}, "adamw_8bit": {"lr": 1e-2},
           "muon": {"lr": 1e-2, "dense_lr": 1e-3}}
# configured variants of a rule (config entries with other options): APOLLO-Mini, LoRA rank 1
# with a dense set, LoGRA with its projection kept and a float32 factor, dense AdamW on LoGRA's
# weights only
VARIANTS = {"apollo_mini": ("apollo", {"lr": 1e-2, "rank": 1, "scale_type": "tensor",
                                       "scale": 128, "update_proj_gap": 2}),
            "lora_dense_head": ("lora", {"lr": 1e-2, "rank": 1, "dense_lr": 1e-3,
                                         "dense_modules": "embed_tokens|lm_head|norm"}),
            "logra_norefresh": ("logra", {"rank": 2, "update_ratio": 1e-2, "refresh": False,
                                          "update_factor_dtype": "float32"}),
            "adamw_8bit_bf16": ("adamw_8bit", {"lr": 1e-2, "bf16_stochastic_round": True}),
            "dense_adam_targets": ("dense_adam", {"lr": 1e-2, "train_only": DEFAULT_MODULES})}
CASES = {name: (name, options) for name, options in OPTIONS.items()} | VARIANTS
BF16 = {"adamw_8bit_bf16"}  # cases on a model stored in bf16 (grpo.param_dtype)


def _load(tiny_dir, case):
    return load(tiny_dir, dtype=torch.bfloat16 if case in BF16 else torch.float32)


def _backward(model, tok):
    ids = tok(PROMPTS, return_tensors="pt", padding=True)
    model(**ids, labels=ids["input_ids"]).loss.backward()


def _logits(model, tok):
    with torch.no_grad():
        return model(**tok(PROMPTS, return_tensors="pt", padding=True)).logits


def _weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _assert_same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for n in a:
        assert torch.equal(a[n], b[n]), n


def test_every_registered_rule_is_covered_and_declares_its_options():
    assert set(OPTIONS) == set(rules.RULES)
    for name in rules.RULES:
        cls = rules.rule_class(name)
        constructor = inspect.signature(cls).parameters
        assert set(cls.options) <= set(constructor), name  # every declared option is taken
        assert set(OPTIONS[name]) <= set(cls.options), name


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_conforms_to_the_interface(tiny_dir, tmp_path, case):
    """propose/apply trains; forwards inside `perturbed` compute another policy and θ is
    restored exactly after it (or the rule says it cannot be scaled); an engine fed only sync
    payloads equals `engine_weights()` after every step; the state round-trips through a
    weights-only checkpoint into a rule on a fresh model, which then takes the same next step;
    `unwrap` leaves a plain architecture that AutoModelForCausalLM loads."""
    rule_name, options = CASES[case]
    torch.manual_seed(0)
    model, tok = _load(tiny_dir, case)
    rule = rules.build(rule_name, model, options)
    initial = {n: w.clone() for n, w in rule.engine_weights().items()}
    engine, bases = {n: w.clone() for n, w in initial.items()}, {}
    for _ in range(3):  # across a basis / projection refresh
        _backward(model, tok)
        step = rule.propose()
        if rule.scalable:
            before, logits = _weights(model), _logits(model, tok)
            with rule.perturbed(step, 0.5):
                assert not torch.equal(_logits(model, tok), logits)
            _assert_same(_weights(model), before)
            assert torch.equal(_logits(model, tok), logits)
        else:
            with pytest.raises(NotImplementedError):
                with rule.perturbed(step, 0.5):
                    pass
        rule.apply(step, 1.0)
        assert all(p.grad is None for p in model.parameters())  # gradients consumed
        apply_payload(engine, rule.sync_payload(), bases)
        _assert_same(engine, {n: w for n, w in rule.engine_weights().items()})
    assert any(not torch.equal(engine[n], initial[n]) for n in initial)  # it trained

    # resume: the model's and the rule's state, saved and loaded as logra/rl/checkpoint.py does:
    # weights-only, with the classes the rule declares
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "rule": rule.state_dict()}, buffer)
    buffer.seek(0)
    with torch.serialization.safe_globals(list(rule.checkpoint_classes)):
        saved = torch.load(buffer, weights_only=True)
    generator = torch.get_rng_state()  # a checkpoint restores it (stochastic rounding draws)
    torch.manual_seed(1)  # a different draw for anything the new rule samples at build
    fresh, _ = _load(tiny_dir, case)
    resumed = rules.build(rule_name, fresh, options)
    fresh.load_state_dict(saved["model"])
    resumed.load_state_dict(saved["rule"])
    for m, r in ((model, rule), (fresh, resumed)):
        torch.set_rng_state(generator)
        _backward(m, tok)
        r.apply(r.propose(), 1.0)
    _assert_same(_weights(fresh), _weights(model))

    rule.unwrap()
    with torch.no_grad():
        ids = tok(PROMPTS, return_tensors="pt", padding=True)
        logits = model(**ids).logits
    model.save_pretrained(tmp_path / "unwrapped")
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path / "unwrapped", dtype=model.dtype,
                                                        output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched weight
    with torch.no_grad():
        torch.testing.assert_close(loaded(**ids).logits, logits, rtol=0, atol=0)


@pytest.mark.parametrize("case", sorted(c for c in CASES
                                         if not rules.rule_class(CASES[c][0]).scalable))
def test_a_rule_that_steps_in_propose_takes_the_schedule_as_a_factor_on_its_lr(tiny_dir, case):
    """A rule whose update cannot be scaled (it applies it in propose) is scheduled as a user's
    lr scheduler would do it: steps at `lr_scale` s are the steps of the rule built with every
    lr times s, and its lrs as built are left in its state (a checkpoint resumes the
    schedule from the loop, not from the lr it saved). Powers of two: the products are exact."""
    rule_name, options = CASES[case]
    lrs = {k: v for k, v in options.items() if k in ("lr", "dense_lr")}
    models, built = [], []
    for scale, opts in ((0.25, {k: 2.0 ** -6 for k in lrs}), (1.0, {k: 2.0 ** -8 for k in lrs})):
        torch.manual_seed(0)
        model, tok = _load(tiny_dir, case)
        rule = rules.build(rule_name, model, options | opts)
        for _ in range(2):
            _backward(model, tok)
            rule.lr_scale = scale
            rule.apply(rule.propose(), scale)
        models.append(_weights(model))
        built.append([float(g["lr"]) for o in rule.optimizers for g in o.param_groups])
    _assert_same(*models)
    assert built[0] == [4 * lr for lr in built[1]]  # as built, not scaled
    with pytest.raises(ValueError, match="cannot be scaled"):
        rule.apply(None, 0.5)  # a scale other than the schedule's


def _compared_rule_names(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each string constant equal to a rule name inside a comparison (`==`,
    `!=`, `in`, `not in`, as either side or in a literal collection there)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                for leaf in ast.walk(side):
                    if isinstance(leaf, ast.Constant) and leaf.value in names:
                        found.append((node.lineno, leaf.value))
    return found


def test_no_code_outside_a_rule_module_compares_against_its_name():
    owner = {name: path.split(":")[0].replace(".", "/") + ".py"
             for name, path in rules.RULES.items()}
    files = [p for d in ("logra", "baselines", "benchmarks", "workflow/scripts")
             for p in sorted((ROOT / d).rglob("*.py"))]
    offences = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel == "logra/rules.py":  # the registry
            continue
        names = {n for n, module in owner.items() if module != rel}
        offences += [f"{rel}:{line}: {name!r}"
                     for line, name in _compared_rule_names(ast.parse(path.read_text()), names)]
    assert not offences, offences


def test_no_code_outside_the_loss_module_compares_against_an_estimators_name():
    """grpo.estimator is chosen once (logra.rl.loss.estimator): every other module asks the
    estimator object, never compares the name."""
    files = [p for d in ("logra", "baselines", "benchmarks", "workflow/scripts")
             for p in sorted((ROOT / d).rglob("*.py")) if p != ROOT / "logra/rl/loss.py"]
    offences = [f"{path.relative_to(ROOT)}:{line}: {name!r}" for path in files
                for line, name in _compared_constants(ast.parse(path.read_text()),
                                                      set(ESTIMATORS))]
    assert not offences, offences
    assert _compared_constants(ast.parse('a = g["estimator"] != "grpo"\nb = g.get("grpo")\n'
                                         'c = e in ("x", "reinforce_baseline")'),
                               set(ESTIMATORS)) == [(1, "grpo"), (3, "reinforce_baseline")]


def _compared_constants(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each of `names` written as a comparison's operand (`x == "grpo"`,
    `x in ("grpo", ...)`); a name used as a key (`g.get("grpo")`) is not a comparison."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                found += [(node.lineno, leaf.value) for leaf in items
                          if isinstance(leaf, ast.Constant) and leaf.value in names]
    return found


def test_the_name_check_finds_a_comparison():
    code = 'x = rule == "lora"\ny = rule in ("galore", "other")\nz = {"lora": 1}'
    assert _compared_rule_names(ast.parse(code), {"lora", "galore"}) == [(1, "lora"),
                                                                          (2, "galore")]


TOY_RULE = '''
"""Sign descent: W -= lr * sign(G), no state."""
import contextlib

import torch

from logra.optim.rule import LR, UpdateRule


class SignDescent(UpdateRule):
    options = {"lr": LR}

    def __init__(self, model, lr=1e-3):
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.lr = lr

    @torch.no_grad()
    def propose(self):
        step = [-self.lr * torch.sign(p.grad) for _, p in self.named]
        self.grad_norm = float(sum(p.grad.norm() ** 2 for _, p in self.named) ** 0.5)
        return step

    @torch.no_grad()
    def apply(self, step, scale=1.0):
        for (_, p), s in zip(self.named, step):
            p.add_(s, alpha=scale)
            p.grad = None

    @contextlib.contextmanager
    def perturbed(self, step, eta):
        saved = [p.detach().clone() for _, p in self.named]
        with torch.no_grad():
            for (_, p), s in zip(self.named, step):
                p.add_(s, alpha=eta)
        try:
            yield
        finally:
            with torch.no_grad():
                for (_, p), w in zip(self.named, saved):
                    p.copy_(w)

    def state_tensors(self):
        return []

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass
'''


@pytest.mark.e2e
def test_a_rule_in_its_own_module_runs_through_the_workflow(smoke_run, tmp_path):
    """README "Add an update rule": a module and a config entry, nothing else. A run of its own
    (its method is not the smoke run's); the smoke run's data and SFT bases serve it as they are
    (copied, so only the rule's GRPO run runs)."""
    for part in ("data", "base"):
        shutil.copytree(smoke_run / "results" / part, tmp_path / "results" / part)
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins/toy_rules.py").write_text(textwrap.dedent(TOY_RULE))
    config = yaml.safe_load((ROOT / "tests/data/smoke.yaml").read_text())
    config["methods"]["sign"] = {"rule": "plugins/toy_rules.py:SignDescent",
                                 "options": {"lr": 1e-3}, "kl_control": {"target": 1e-2}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    env = os.environ | {"PYTHONPATH": str(ROOT)}  # the rule's file is found by its path
    run = tmp_path / "results/runs/arithmetic/sign/seed0"
    out = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
                          "--configfile", str(tmp_path / "config.yaml"), "--cores", "2",
                          "--directory", str(tmp_path), str(run.relative_to(tmp_path) / "summary.json")],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = yaml.safe_load((run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["config"]["method"]["rule"] == "plugins/toy_rules.py:SignDescent"
    assert summary["optimizer_state_bytes"] == 0


def test_a_rule_that_is_not_an_update_rule_is_refused():
    with pytest.raises(ValueError, match="cannot import no_such_module:Rule .*; a module outside "
                                         "this directory: give its file, path/to/file.py:Class"):
        rules.rule_class("no_such_module:Rule")
    with pytest.raises(ValueError, match="cannot import no_such_file.py:Rule .*is not a file"):
        rules.rule_class("no_such_file.py:Rule")
    with pytest.raises(ValueError, match="is not a subclass of logra.optim.rule.UpdateRule"):
        rules.rule_class("copy:deepcopy")


def test_a_rule_loads_from_its_file_once(tmp_path):
    """`path/to/file.py:Class`: the file is imported by its path (no PYTHONPATH), once per
    process, whatever the working directory's layout."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins/toy_rules.py").write_text(textwrap.dedent(TOY_RULE))
    cls = rules.rule_class(f"{tmp_path}/plugins/toy_rules.py:SignDescent")
    assert issubclass(cls, UpdateRule) and cls.__name__ == "SignDescent"
    assert rules.rule_class(f"{tmp_path}/plugins/toy_rules.py:SignDescent") is cls


def test_a_rule_path_that_has_moved_names_its_new_path():
    with pytest.raises(ValueError, match="moved to logra.optim.logra_rule; write "
                                         "logra.optim.logra_rule:LoGRA"):
        rules.rule_class("logra.logra:LoGRA")
    assert rules.rule_class("logra.optim.logra_rule:LoGRA") is rules.rule_class("logra")
