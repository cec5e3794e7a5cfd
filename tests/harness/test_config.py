"""Bad configuration stops before any job runs, naming the key."""
import copy
import re
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT

from logra.harness.config import (
    ConfigError,
    margin_seeds,
    resolve,
    run_config,
    task_options,
    validate_file,
)
from logra.harness.plan import add_lr_sweep_methods, build_plan, grid_points, margin_runs
from logra.rl.tasks import get_task

SMOKE = yaml.safe_load((ROOT / "tests/data/smoke.yaml").read_text())


def _write(tmp_path, config):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _study(horizons: dict) -> dict:
    return {"task": "arithmetic", "arms": {"dense_adam": 1e-4, "logra": 2e-4},
            "reference": "dense_adam", "schedule": {"warmup": 0.05, "decay": 1.5, "final": 0.1},
            "horizons": horizons}


def test_default_and_smoke_configs_are_valid():
    config = validate_file(ROOT / "config/config.yaml")
    assert config["grpo"]["aggregation"] == "dapo" and len(config["seeds"]) >= 3
    assert validate_file(ROOT / "tests/data/smoke.yaml")["grpo"]["beta"] == 0.0  # defaults filled
    paper = validate_file(ROOT / "config/paper.yaml")
    assert paper["rollout"]["engine"] == "vllm" and paper["grpo"]["compute_dtype"] == "bfloat16"
    assert {t["type"] for t in paper["tasks"].values()} == {"gsm8k", "math"}


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["grpo"].update(learning_rate=1), r"grpo.learning_rate: unknown key; valid: "),
    # an unknown key names the closest valid one
    (lambda c: c["grpo"].update(stpes=2), r"grpo.stpes: unknown key; did you mean 'steps'\?"),
    (lambda c: c["grpo"].update(steps="ten"), "'ten' is not of type 'integer'"),
    (lambda c: c["grpo"].update(aggregation="sum"), "'sum' is not one of"),
    (lambda c: c.update(seed=[1]), r"config: seed: unknown key; did you mean 'seeds'\?"),
    (lambda c: c["methods"].update(logra={"rule": "logra", "kl_control": {"target": -1}}),
     "-1 is less than or equal to the minimum of 0"),
    # a stage's value without the others' `default`; a stage no job has
    (lambda c: c["cluster"].update(mem_gb={"train": 4}), "cluster.mem_gb.default is required"),
    (lambda c: c["cluster"]["runtime_min"].update(summary=5), "'summary' is not one of"),
    (lambda c: c["methods"]["dense_adam"].update(rollout={"dtype": "float16"}),
     "'float16' is not one of"),
    (lambda c: c["methods"]["dense_adam"].update(rollout={"engine": "vllm"}),
     "methods.dense_adam.rollout.engine: unknown key"),
    # integers are ints (JSON Schema counts 2.0 as one; a job then fails on it), booleans bools,
    # and numbers bounded where a larger one overflows inside a job
    (lambda c: c["grpo"].update(steps=2.0), r"grpo.steps: 2.0 is not of type 'integer'"),
    (lambda c: c["grpo"].update(group_size=4.0), r"grpo.group_size: 4.0 is not of type 'integer'"),
    (lambda c: c.update(seeds=[0.0, 1.0]), r"seeds.\d: \d.0 is not of type 'integer'"),
    (lambda c: c.update(seeds=[True]), r"seeds.0: True is not of type 'integer'"),
    (lambda c: c.update(complete="false"), r"complete: 'false' is not of type 'boolean'"),
    (lambda c: c.update(seeds=[10**30]), r"seeds.0: .* is greater than the maximum of 2147483647"),
    (lambda c: c["lr_sweep"].update(points=2200), r"lr_sweep.points: 2200 is greater than the "
                                                  r"maximum of 64"),
    # what sizes work at parse time or in every evaluation is bounded
    (lambda c: c.update(study=_study({"h4": {"seeds": {"min": 2, "max": 3_000_000_000,
                                                       "half_width": 0.02}}})),
     r"study.horizons.h4.seeds.max: 3000000000 is greater than the maximum of 1000"),
    (lambda c: c.update(study=_study({"h04": {"seeds": {"min": 2, "max": 3,
                                                        "half_width": 0.02}}})),
     r"study.horizons: 'h04' does not match"),
    (lambda c: c["eval"].update(protocols={"sampled": {"samples": 100_000, "temperature": 1}}),
     r"eval.protocols.sampled.samples: 100000 is greater than the maximum of 256"),
    (lambda c: c["eval"].update(protocols={"sampled": {"samples": 4, "temperature": 1e6}}),
     r"eval.protocols.sampled.temperature: 1000000.0 is greater than the maximum of 10"),
])
def test_schema_rejects_with_the_key(tmp_path, edit, message):
    config = copy.deepcopy(SMOKE)
    edit(config)
    with pytest.raises(ConfigError, match=message):
        validate_file(_write(tmp_path, config))


@pytest.mark.parametrize("edit, message", [
    # a rule's options are checked against what the rule declares (UpdateRule.options)
    (lambda c: c["methods"]["dense_adam"]["options"].update(rank=4),
     r"methods.dense_adam.options: .*'rank' was unexpected"),
    (lambda c: c["methods"].update(logra={"rule": "logra", "options": {"rank": "8"}}),
     "methods.logra.options.rank: '8' is not of type 'integer'"),
    (lambda c: c["methods"]["dense_adam"]["options"].update(lr=-1.0),
     "methods.dense_adam.options.lr: -1.0 is less than or equal to the minimum of 0"),
    (lambda c: c["methods"]["dense_adam"]["options"].update(lr={"arithmetic": -1.0}),
     "methods.dense_adam.options.lr.arithmetic: -1.0 is less than or equal to the minimum of 0"),
    (lambda c: c["methods"]["dense_adam"]["options"].update(lr={}),
     "methods.dense_adam.options.lr: {} should be non-empty"),
    (lambda c: c["methods"]["logra"]["options"].update(rank={"arithmetic": 2}),
     "methods.logra.options.rank: .* is not of type 'integer'"),
    (lambda c: c["methods"].update(sign={"rule": "sgd"}),
     r"methods.sign.rule: unknown rule 'sgd'; known: \['adam_mini', 'adamw_8bit', 'apollo', "
     r"'dense_adam', 'galore', 'logra', 'lora', 'muon', 'sketch_adam'\]"),
    (lambda c: c["methods"].update(sign={"rule": "logra.optim.rule:low_rank_linears"}),
     "methods.sign.rule: .* is not a subclass of logra.optim.rule.UpdateRule"),
    (lambda c: c["run_methods"].append("galore"), r"run_methods\[2\]: 'galore' is not defined"),
    (lambda c: c["tasks"]["arithmetic"]["options"].update(digitz=3),
     "tasks.arithmetic.options: .*digitz"),
    (lambda c: c.update(threads=2), r"threads: 2; reproducible CPU runs use one thread per job"),
    (lambda c: c["sft"].update(steps={"arithmetic": 10}),
     r"sft.steps: no value for 'countdown' \(given for: \['arithmetic'\]\)"),
    (lambda c: c["tasks"]["arithmetic"].update(type="chess"),
     r"tasks.arithmetic.type: 'chess' is not a registered task \(registered: \["),
    (lambda c: c.update(verdict={"reference": "adam"}), r"verdict.reference: 'adam' is not defined"),
    (lambda c: c["methods"].update(logra={"rule": "logra", "options": {"rank": 200}}),
     r"methods.logra.options: rank=200 exceeds the input width 128 of model.layers.0.self_attn"),
    (lambda c: c["methods"].update(logra={"rule": "logra", "options": {
        "target_modules": ["xyz"]}}),
     r"methods.logra.options: target_modules: \['xyz'\] match no module of the model"),
    (lambda c: c["methods"].update(sa={"rule": "sketch_adam", "options": {"modules": "xyz"}}),
     "methods.sa.options: modules: pattern 'xyz' matches no nn.Linear"),
    # LoGRA brings its own controller: a second one is refused, and so is a probe too small
    (lambda c: c["methods"]["logra"].update(kl_control={"target": 1e-3}),
     r"methods.logra.kl_control: rule 'logra' controls its own step"),
    (lambda c: c["methods"]["logra"]["options"].update(probe_responses=5),
     r"methods.logra.options.probe_responses: 5 sequences exceed the probe's prediction half "
     r"\(grpo.probe_size // 2 = 4"),
    (lambda c: c["methods"].update(lora={"rule": "lora", "options": {"rank": 129}}),
     r"methods.lora.options: rank=129 exceeds min\(shape\)=128 of model.layers.0.self_attn"),
    (lambda c: c["methods"]["dense_adam"].update(grpo={"step": 10}),
     "methods.dense_adam.grpo: unknown key 'step'"),
    (lambda c: c.update(ablation_methods=["lora"]),
     r"ablation_methods\[0\]: 'lora' is not defined"),
    (lambda c: c.update(lr_sweep={"tasks": ["arithmetic"], "anchors": {"galore": 1e-3}}),
     r"lr_sweep.anchors\[0\]: 'galore' is not defined"),
    (lambda c: c.update(lr_sweep={"tasks": ["arithmetic", "gsm8k"],
                                  "anchors": {"dense_adam": 1e-3}}),
     "lr_sweep.tasks: 'gsm8k' is not defined under tasks"),
    (lambda c: c["methods"]["dense_adam"]["options"].update(lr={"arithmetic": 1e-4}),
     r"methods.dense_adam.options.lr: no value for 'countdown' \(given for: \['arithmetic'\]"),
    (lambda c: (c["tasks"].update(gsm8k={"type": "gsm8k", "options": {
                    "train_path": "train.jsonl", "test_path": "test.jsonl"}}),
                c["data"].update(n_train=None), c["methods"]["dense_adam"].update(options={}),
                c.update(lr_sweep={"tasks": ["gsm8k"], "anchors": {"dense_adam": 1e-3}})),
     r"lr_sweep.n_val: .*dataset task 'gsm8k'.*set data.n_train"),
    (lambda c: c["grpo"].update(nproc_per_node=4),  # 2 x 4 sequences, micro-batch 4
     "does not split into global micro-batches of micro_batch_size x nproc_per_node = 4 x 4"),
    (lambda c: c["grpo"].update(nproc_per_node=2, prompts_per_step=4, micro_batch_size=2),
     "grpo.checkpoint_every=20: resume checkpoints are single-process; set 0"),
    (lambda c: (c["grpo"].update(nproc_per_node=2, prompts_per_step=4, checkpoint_every=0),
                c["methods"].update(lora={"rule": "lora"}), c.update(run_methods=["lora"])),
     r"methods.lora.rule: 'lora' cannot run sharded \(grpo.nproc_per_node=2\)"),
    (lambda c: c["methods"]["dense_adam"].update(sync="low_rank"),
     r"methods.dense_adam.sync: transport 'low_rank' does not apply to rule DenseAdam"),
    (lambda c: c.setdefault("rollout", {}).update(sync="low_rank"),  # dense_adam takes it
     r"rollout.sync: transport 'low_rank' does not apply to rule DenseAdam .*dense_adam"),
    (lambda c: c.update(sync_regime={"task": "arithmetic", "methods": ["adam_bf16"],
                                     "lr_scales": {"a": 1}}),
     r"sync_regime.methods\[0\]: 'adam_bf16' is not defined"),
    (lambda c: c.update(sync_regime={"task": "arithmetic", "methods": ["dense_adam"],
                                     "lr_scales": {"a": 1, "b": 1.0, "c": 0.5}}),
     r"sync_regime.lr_scales: regimes \['a', 'b'\] all run the methods as they are"),
    (lambda c: c.update(sync_regime={"task": "linear", "methods": ["dense_adam"],
                                     "lr_scales": {"a": 1}}),
     "sync_regime.task: 'linear' is not defined under tasks"),
    (lambda c: c.update(eval={"primary": "t2"}),
     r"eval.primary: 't2' is not one of eval.protocols \(greedy, sampled, t1\)"),
    (lambda c: c.update(eval={"protocols": {"greedy": {"samples": 4, "temperature": 0}},
                              "primary": "greedy"}),
     r"eval.protocols.greedy: greedy decoding \(temperature 0\) gives one answer"),
    (lambda c: c.update(verdict={"margin": {"seeds": [1, 5]}}),
     r"verdict.margin.seeds: \[1\] are seeds of the grid or of the lr sweep"),
    (lambda c: c["grpo"].update(group_size=1),
     r"grpo.group_size=1: GRPO's advantages compare the responses of one prompt \(at least 2\), "
     r"or set grpo.estimator: reinforce_baseline"),
    (lambda c: c["methods"]["dense_adam"].update(grpo={"length_reference": 1024}),
     r"methods.dense_adam.grpo.length_reference: weighs REINFORCE's advantages"),
    (lambda c: c["methods"]["dense_adam"].update(grpo={"warmup_steps": 9, "decay_steps": 9}),
     r"methods.dense_adam.grpo.decay_steps=9: the decay ends after the warmup "
     r"\(methods.dense_adam.grpo.warmup_steps=9"),
    # a key the method's own estimator never reads (the global section may hold it for others)
    (lambda c: c["methods"]["dense_adam"].update(grpo={"importance_cap": 3.0}),
     r"methods.dense_adam.grpo.importance_cap: does nothing under grpo.estimator grpo \(read "
     r"by reinforce_baseline\); drop it"),
    (lambda c: c["methods"]["logra"].update(grpo={"estimator": "reinforce_baseline",
                                                  "group_size": 1, "clip_high": 0.3}),
     r"methods.logra.grpo.clip_high: does nothing under grpo.estimator reinforce_baseline"),
    (lambda c: c["grpo"].update(importance_cap=1e-300),
     r"grpo.importance_cap: 1e-300 is less than the minimum of 1"),
    (lambda c: c.update(rollout={"options": {"bogus_kw": 1}}),
     r"rollout.options.bogus_kw: not an option of rollout.engine 'hf' \(its options: \[\]"),
    # shapes that would crash inside a job, or measure what they do not say
    (lambda c: c["model"]["tiny"].update(num_key_value_heads=3),
     r"model.tiny: model.num_attention_heads=2 is not divisible by model.num_key_value_heads=3"),
    (lambda c: c["memory_sweep"]["shape"].update(micro_batch=8),
     r"memory_sweep.sizes.s1: micro_batch 8 is larger than the batch 4"),
    (lambda c: c["memory_sweep"]["sizes"]["s1"].update(max_position_embeddings=6),
     r"memory_sweep.sizes.s1.max_position_embeddings: 6 positions, shorter than the measured "
     r"sequence \(prompt_len \+ completion_len = 8\)"),
    (lambda c: c["memory_sweep"]["sizes"]["s1"].update(num_attention_heads=3),
     r"memory_sweep.sizes.s1: model.hidden_size=64 is not divisible by "
     r"model.num_attention_heads=3"),
    (lambda c: c["memory_sweep"]["sizes"]["s1"].update(hidden_size=16, intermediate_size=1,
                                                       num_attention_heads=1),
     r"methods.logra.options \(on memory_sweep.sizes.s1\): rank=2 exceeds the input width 1"),
    (lambda c: c["planner"]["models"].update(qwen2=".config/models/none.json"),
     r"planner.models.qwen2: .config/models/none.json is not a file"),
    (lambda c: c.update(verdict={"contrasts": [["logra", "dense"]]}),
     r"verdict.contrasts\[0\]: 'dense' is not defined under methods"),
    (lambda c: c.update(reinforce_methods=["logra_reinforce"]),
     r"reinforce_methods\[0\]: 'logra_reinforce' is not defined under methods"),
    (lambda c: c["methods"]["logra"].update(grpo={"estimator": "reinforce"}),
     r"methods.logra.grpo.estimator: 'reinforce' is not one of \['grpo', 'reinforce_baseline'\]"),
    (lambda c: (c["grpo"].update(nproc_per_node=2, prompts_per_step=4, checkpoint_every=0),
                c["methods"]["dense_adam"].update(grpo={"param_dtype": "bfloat16"})),
     r"methods.dense_adam.grpo.param_dtype=bfloat16: weights stored in bf16 run in one process"),
    (lambda c: c["methods"]["dense_adam"].update(grpo={"param_dtype": "bf16"}),
     r"methods.dense_adam.grpo.param_dtype: 'bf16' is not one of \['float32', 'bfloat16'\]"),
    (lambda c: c["methods"]["logra"].update(grpo={"decay_final": 5}),
     r"methods.logra.grpo.decay_final: 5 is greater than the maximum of 1"),
    (lambda c: c["stability"]["criterion"]["spikes"].update(min_history=4),
     r"stability.criterion.spikes.min_history: 4 steps of history, but the window holds 3"),
    (lambda c: c["stability"]["criterion"]["collapse"].update(prompts=7),
     r"stability.criterion.collapse.prompts: 7, but task 'arithmetic''s test split has 6 "
     r"problems"),
    (lambda c: c["methods"]["dense_adam"]["grpo"].update(snapshot_every=3),
     r"methods.dense_adam.grpo.snapshot_every: 3, but a stability run needs a snapshot before "
     r"its last step \(steps 3\)"),
    (lambda c: c["stability"].pop("criterion"),
     r"stability.criterion is required and no file sets it"),
    # a misspelt task in a per-task map would be dropped silently, its task keeping another value
    (lambda c: c["methods"]["dense_adam"]["options"]["lr"].update(countdwon=1.0e-2),
     r"methods.dense_adam.options.lr.countdwon: not a task of this config \(arithmetic, "
     r"countdown\), a registered task type or `default`; did you mean 'countdown'\?"),
    (lambda c: c["methods"]["logra"]["options"].update(update_ratio={"countdwon": 1.0e-2,
                                                                     "default": 3.0e-3}),
     r"methods.logra.options.update_ratio.countdwon: not a task of this config"),
    (lambda c: c["sft"].update(steps={"arithmetic": 10, "countdown": 10, "chess": 5}),
     r"sft.steps.chess: not a task of this config \(arithmetic, countdown\), a registered task "
     r"type or `default` \(set by "),
    # a synthetic task's distinct questions hold its splits (1-digit sums: 81), as the data
    # job draws them
    (lambda c: c["data"].update(n_train=90),
     r"data.n_train: task 'arithmetic' cannot fill data.n_train 90 \+ data.n_test 6 \+ "
     r"lr_sweep.n_val 8 distinct questions \(arithmetic: only 81 distinct questions found.*"
     r"widen tasks.arithmetic.options"),
    # a dataset task's local files are read at config time
    (lambda c: (c["tasks"].update(gsm8k={"type": "gsm8k", "options": {
        "train_path": "/no/such/train.jsonl", "test_path": "/no/such/test.jsonl"}}),
                c["methods"]["dense_adam"]["options"]["lr"].update(default=1e-4)),
     r"tasks.gsm8k.options: \[Errno 2\] No such file or directory: '/no/such/train.jsonl'"),
    # on the tiny model (a token a character) the lengths hold at least half of the targets
    (lambda c: c["eval"].update(max_gen_toks=2),
     r"eval.max_gen_toks: 2 tokens hold \d+% of the train targets of task 'arithmetic' \(on the "
     r"tiny model a token is a character: median 3, .*raise eval.max_gen_toks"),
])
def test_cross_key_checks_name_the_key(tmp_path, edit, message):
    config = copy.deepcopy(SMOKE)
    edit(config)
    with pytest.raises(ConfigError, match=message):
        validate_file(_write(tmp_path, config))


def test_a_job_process_skips_only_building_the_rules(tmp_path):
    """`fit_rules=False` (a job Snakemake starts in a process of its own, after the main process
    checked the same config in full) skips building the rules on the models, and nothing else."""
    config = copy.deepcopy(SMOKE)
    config["methods"]["logra"]["options"]["rank"] = 200  # wider than the model
    path = _write(tmp_path, config)
    with pytest.raises(ConfigError, match="rank=200 exceeds the input width 128"):
        resolve([path], default=None)
    assert resolve([path], default=None, fit_rules=False)["methods"]["logra"]["options"][
        "rank"] == 200
    config["run_methods"].append("galore")
    with pytest.raises(ConfigError, match=r"run_methods\[2\]: 'galore' is not defined"):
        resolve([_write(tmp_path, config)], default=None, fit_rules=False)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["methods"]["dense_adam"]["options"].update(lr=float("nan")),
     r"methods.dense_adam.options.lr: nan is not a finite number"),
    (lambda c: c["grpo"].update(temperature=float("inf")),
     r"grpo.temperature: inf is not a finite number"),
    # YAML 1.1 reads 1e-3 as a string: the error says how to write it
    (lambda c: c["sft"].update(lr="1e-3"),
     r"sft.lr: '1e-3' is not of type 'number' \('1e-3' was read as a string: .* write 1.0e-3\)"),
    (lambda c: c["methods"]["dense_adam"]["options"].update(lr="5e-5"),
     r"methods.dense_adam.options.lr: .* write 5.0e-5"),
    # sizes that would fail inside a job: SFT's held-out slice + a batch, a GRPO step's prompts
    (lambda c: c["data"].update(n_train=12),
     r"data.n_train: 12 train examples cannot hold SFT's held-out slice "
     r"\(sft.eval_examples: 8\) plus one batch \(sft.batch_size: 8\)"),
    (lambda c: (c["data"].update(n_train=16), c["methods"]["dense_adam"].update(
        grpo={"prompts_per_step": 17})),
     r"methods.dense_adam.grpo.prompts_per_step: 17 prompts per step .* data.n_train: 16"),
])
def test_bad_values_that_used_to_pass_are_named(tmp_path, edit, message):
    config = copy.deepcopy(SMOKE)
    edit(config)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.dump(config))  # .nan, .inf; '1e-3' quoted, as YAML 1.1 reads 1e-3
    with pytest.raises(ConfigError, match=message):
        validate_file(path)


def test_a_key_given_twice_is_refused_naming_file_and_line(tmp_path):
    path = tmp_path / "config.yaml"
    text = (ROOT / "tests/data/smoke.yaml").read_text()
    path.write_text(text.replace("grpo: {steps: 3,", "grpo: {steps: 3, steps: 30,"))
    line = 1 + text[:text.index("grpo: {steps: 3,")].count("\n")
    with pytest.raises(ConfigError, match=rf"config.yaml:{line}: key 'steps' is given twice in "
                                          rf"one mapping \(first on line {line}\)"):
        validate_file(path)
    path.write_text(text + "seeds: [5]\n")
    with pytest.raises(ConfigError, match=r"key 'seeds' is given twice .* \(first on line 4\)"):
        validate_file(path)
    # YAML merge keys may still be overridden: config/config.yaml is full of them
    validate_file(ROOT / "config/config.yaml")


def test_an_overlay_changes_only_the_keys_it_names(tmp_path):
    """`--configfile` files merge over config/config.yaml as Snakemake merges configs, and
    `--config` values (every nested scalar a string, as Snakemake passes them) over both."""
    default = resolve([])
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("grpo: {steps: 2}\nmethods: {logra: {options: {rank: 4}}}\n")
    merged = resolve([overlay])
    assert merged["grpo"] == default["grpo"] | {"steps": 2}
    assert merged["methods"]["logra"]["options"] == default["methods"]["logra"]["options"] | {
        "rank": 4}
    assert {k: v for k, v in merged.items() if k not in ("grpo", "methods")} == \
        {k: v for k, v in default.items() if k not in ("grpo", "methods")}
    given = resolve([overlay], {"grpo": {"steps": "3", "beta": "1e-3"}, "seeds": [7]})
    assert (given["grpo"]["steps"], given["grpo"]["beta"], given["seeds"]) == (3, 0.001, [7])


def test_a_complete_config_replaces_what_came_before():
    paper = resolve([ROOT / "config/paper.yaml"])
    assert set(paper["tasks"]) == {"gsm8k", "math"}  # not the default's tasks beside them
    assert paper == validate_file(ROOT / "config/paper.yaml")
    assert resolve([ROOT / "tests/data/smoke.yaml"]) == validate_file(
        ROOT / "tests/data/smoke.yaml")


@pytest.mark.parametrize("text, message", [
    ("grpo: {steps: 0}\n",
     r"config: grpo.steps: 0 is less than the minimum of 1 \(set by .*overlay.yaml\); config "
     r"merged from .*config/config.yaml < .*overlay.yaml: later files override the keys they "
     r"name, nested maps merge, and a file with `complete: true` replaces all before it"),
    ("complete: true\ngrpo: {steps: 2}\n",
     r"config: seeds is required and no file sets it; config merged from .*overlay.yaml "
     r"\(complete\)"),
    # a misspelt key: the file that wrote it, not the one that set its section
    ("grpo: {stpes: 2}\n",
     r"config: grpo.stpes: unknown key; did you mean 'steps'\? \(set by .*overlay.yaml\)"),
    # every per-task value that misses a task, in one error, each line naming its file
    ("tasks: {successor: {type: linear}}\nmethods:\n"
     "  mine: {rule: dense_adam, options: {lr: {arithmetic: 1.0e-4}}}\n"
     "  yours: {rule: dense_adam, options: {lr: {countdown: 1.0e-4}}}\n",
     r"per-task values: 2 name no value for a task of this config; give each that task, or a "
     r"`default`:\n  methods.mine.options.lr: no value for 'countdown', 'successor' \(given for: "
     r"\['arithmetic'\]\) \(set by .*overlay.yaml\)\n  methods.yours.options.lr: no value "
     r"for 'arithmetic', 'successor' .*\nconfig merged from"),
    # a key the overlay set under the one the error names, and another key the error names
    ("model: {tiny: {num_attention_heads: 3}}\n",
     r"model.tiny: .* \(set by .*config/config.yaml; model.tiny.num_attention_heads by "
     r".*overlay.yaml\)"),
    ("data: {n_test: 100000}\n",
     r"data.n_train: .*data.n_test 100000 .*\(set by .*config/config.yaml; data.n_test by "
     r".*overlay.yaml\)"),
    # a method's own option, named as such before memory_real's combination with it
    ("methods: {dense_adam: {options: {lr: -1}}}\n",
     r"^methods.dense_adam.options.lr: -1 is less than .*\(set by .*overlay.yaml\)"),
])
def test_a_broken_overlay_names_the_key_the_file_and_how_files_combine(tmp_path, text, message):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(text)
    with pytest.raises(ConfigError, match=message):
        resolve([overlay])


def test_snakemake_stops_before_any_job(tmp_path):
    """A Snakemake run of its own: its config is the bad input, refused before any job."""
    config = copy.deepcopy(SMOKE)
    config["grpo"]["micro_batch"] = 4
    out = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
                          "--configfile", str(_write(tmp_path, config)), "--cores", "1",
                          "--directory", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode != 0
    assert "grpo.micro_batch: unknown key; did you mean 'micro_batch_size'?" in (out.stdout
                                                                                + out.stderr)
    assert not (tmp_path / "results").exists()


def test_galore_with_kl_control_is_rejected(tmp_path):
    config = copy.deepcopy(SMOKE)
    config["methods"]["galore"] = {"rule": "galore", "kl_control": {"target": 0.01}}
    with pytest.raises(ConfigError, match="methods.galore.kl_control: rule 'galore' cannot scale"):
        validate_file(_write(tmp_path, config))


def test_a_paper_setting_method_is_checked_as_a_run_method_is(tmp_path):
    config = copy.deepcopy(SMOKE)
    config["paper_setting"] = copy.deepcopy(validate_file(ROOT / "config/config.yaml")[
        "paper_setting"])
    validate_file(_write(tmp_path, config))
    port = config["paper_setting"]["settings"]["port_7b"]
    for options, message in (
            ({"logra": {"controler": False}},
             r"paper_setting.settings.port_7b.method_options.logra.options: .*'controler'"),
            ({"galore": {}}, r"paper_setting.settings.port_7b.method_options.galore: not one "
                             r"of paper_setting.methods")):
        port["method_options"] = options
        with pytest.raises(ConfigError, match=message):
            validate_file(_write(tmp_path, config))
    port["method_options"] = {}
    config["paper_setting"]["methods"]["logra"]["options"]["rnak"] = 4
    with pytest.raises(ConfigError, match=r"paper_setting.methods.logra.options: .*'rnak'"):
        validate_file(_write(tmp_path, config))


def test_memory_reals_methods_and_options_are_checked_and_its_folder_is_its_own(tmp_path):
    config = copy.deepcopy(SMOKE)
    config["memory_real"] = copy.deepcopy(validate_file(ROOT / "config/config.yaml")[
        "memory_real"])
    validate_file(_write(tmp_path, config))
    for methods, message in (({"dense_adam": {}, "galore": {}},
                              r"memory_real.methods\[1\]: 'galore' is not defined under methods"),
                             ({"logra": {"rnak": 256}}, r"memory_real.methods.logra.options: "
                                                        r".*'rnak'")):
        with pytest.raises(ConfigError, match=message):
            validate_file(_write(tmp_path, config | {"memory_real": config["memory_real"]
                                                     | {"methods": methods}}))
    config["memory_real"]["model"]["num_attention_heads"] = 5
    with pytest.raises(ConfigError, match="memory_real.model: model.hidden_size=896 is not "
                                          "divisible by model.num_attention_heads=5"):
        validate_file(_write(tmp_path, config))
    config = copy.deepcopy(SMOKE)
    config["memory_sweep"]["sizes"]["real"] = config["memory_sweep"]["sizes"].popitem()[1]
    with pytest.raises(ConfigError, match="memory_sweep.sizes.real: `real` is memory_real's "
                                          "folder"):
        validate_file(_write(tmp_path, config))


def test_lr_sweep_grids_are_spaced_alike_in_step_size_and_define_the_bracket_rules_points():
    """Every method's grid holds `points` declared points around its anchor and the `extend`
    points beyond each edge the bracket rule may add, neighbours a factor apart in step size:
    an lr by the factor, LoGRA's KL budget by its square (its update_ratio, the step, by the
    factor). The reference's configured lr is a point of its grid; each copy sets the rule's
    knob, measures no memory and keeps every other key."""
    config = validate_file(ROOT / "config/config.yaml")
    configured = config["methods"]["dense_adam"]["options"]["lr"]
    logra = copy.deepcopy(config["methods"]["logra"]["options"])
    grids = add_lr_sweep_methods(config)
    sweep = grid_points(grids)
    spec = config["lr_sweep"]
    for method, anchor in spec["anchors"].items():
        g = grids[method]
        declared = [v for _, v in g.points(g.declared).values()]
        assert len(declared) == spec["points"] and anchor in declared
        assert len(g.values) == spec["points"] + 2 * spec["extend"] == len(g.names)
        step = spec["factor"] ** (2 if method == "logra" else 1)
        values = sorted(g.values.values())
        assert all(b / a == pytest.approx(step) for a, b in zip(values, values[1:])), method
        assert all(config["methods"][name]["grpo"]["measure_memory"] is False
                   for name in g.names.values())
    configured = configured.values() if isinstance(configured, dict) else [configured]
    assert "dense_adam" not in sweep  # each task's configured lr is one of the sweep's runs
    assert all(("dense_adam", lr) in sweep.values() for lr in configured)
    assert sweep["dense_adam_lr2p5em05"] == ("dense_adam", 2.5e-05)
    assert sweep["dense_adam_lr0p0001"] == ("dense_adam", 1e-04)
    # LoGRA's points: budget x4, update_ratio x2 (the step), the final budget in proportion
    for task in spec["tasks"]:
        conf = task_options(logra, task)
        at = task_options(config["methods"]["logra_lr0p0002"]["options"], task)
        up = task_options(config["methods"]["logra_lr0p0008"]["options"], task)
        assert at == pytest.approx(conf | {
            "kl_budget": 2e-4, "kl_budget_final": conf["kl_budget_final"] * 2e-4
            / conf["kl_budget"], "update_ratio": conf["update_ratio"]
            * (2e-4 / conf["kl_budget"]) ** 0.5}, rel=1e-11)
        assert up == pytest.approx(at | {"kl_budget": 8e-4, "update_ratio": 2 * at["update_ratio"],
                                         "kl_budget_final": 4 * at["kl_budget_final"]},
                                   rel=1e-11)
    derived = config["methods"]["galore_lr0p0005"]
    assert derived["options"] == config["methods"]["galore"]["options"] | {"lr": 5e-4}
    assert derived["grpo"] == config["methods"]["galore"]["grpo"] | {"measure_memory": False}
    assert {k: v for k, v in derived.items() if k not in ("options", "grpo")} == {
        k: v for k, v in config["methods"]["galore"].items() if k not in ("options", "grpo")}
    assert config["methods"]["logra"]["options"] == logra  # untouched


def test_lrs_given_per_task_take_the_runs_task(tmp_path):
    config = copy.deepcopy(SMOKE)
    per_task = {"arithmetic": 1e-3, "countdown": 2e-3}
    config["methods"]["sa"] = {"rule": "sketch_adam", "options": {"lr": per_task,
                                                                  "dense_lr": 5e-4, "rank": 2}}
    config["methods"]["galore"] = {"rule": "galore", "options": {"lr": 1e-3, "dense_lr": per_task}}
    config["methods"]["lora"] = {"rule": "lora", "options": {"lr": per_task}}
    config["methods"]["logra"]["options"]["update_ratio"] = per_task
    config = validate_file(_write(tmp_path, config))
    options = {(t, m): run_config(config, t, m, 1)["method"]["options"]
               for t in config["tasks"] for m in ("sa", "galore", "lora", "logra")}
    # a rule with a `seed` option gets the run's (1 here)
    assert options["arithmetic", "sa"] == {"lr": 1e-3, "dense_lr": 5e-4, "rank": 2, "seed": 1}
    assert options["countdown", "sa"] == {"lr": 2e-3, "dense_lr": 5e-4, "rank": 2, "seed": 1}
    assert options["countdown", "galore"] == {"lr": 1e-3, "dense_lr": 2e-3}
    assert options["countdown", "lora"] == {"lr": 2e-3}
    assert options["countdown", "logra"]["update_ratio"] == 2e-3
    add_lr_sweep_methods(config | {"lr_sweep": config["lr_sweep"] | {"anchors": {"sa": 1e-4}}})
    assert run_config(config, "countdown", "sa_lr0p0001", 0)["method"]["options"]["lr"] == 1e-4


def test_default_config_splits_fit_every_sweep_task():
    """Test, train and the lr sweep's validation split draw disjoint questions: each task of
    `lr_sweep.tasks` must have enough of them."""
    config = validate_file(ROOT / "config/config.yaml")
    data = config["data"]
    for name in config["lr_sweep"]["tasks"]:
        t = config["tasks"][name]
        splits = get_task(t["type"], **t["options"]).splits(
            data["seed"], data["n_train"], data["n_test"], config["lr_sweep"]["n_val"])
        assert [len(splits[k]) for k in ("train", "test", "val")] == [
            data["n_train"], data["n_test"], config["lr_sweep"]["n_val"]], name


def test_per_task_values_fall_back_to_default(tmp_path):
    """A value given per task covers the tasks it does not name with its `default`: a new task
    needs no edit of every per-task map."""
    config = copy.deepcopy(SMOKE)
    config["methods"]["dense_adam"]["options"]["lr"] = {"arithmetic": 1e-4, "default": 3e-4}
    config["sft"]["steps"] = {"default": 7, "countdown": 9}
    config = validate_file(_write(tmp_path, config))
    lrs = {t: run_config(config, t, "dense_adam", 0)["method"]["options"]["lr"]
           for t in ("arithmetic", "countdown")}
    assert lrs == {"arithmetic": 1e-4, "countdown": 3e-4}
    assert [task_options(config["sft"], t)["steps"] for t in ("arithmetic", "countdown")] == [7, 9]


def test_sync_regimes_scale_every_lr_of_their_methods(tmp_path):
    """A regime at scale 1 runs its methods as they are; another runs copies named
    <method>_<regime> whose step-size options (`lr` or LoGRA's `update_ratio`, `*_lr`, per task
    too) are scaled and whose other keys are the method's; a copy's name that is already a
    method is refused."""
    from logra.harness.plan import add_sync_regime_methods
    config = validate_file(ROOT / "config/config.yaml")
    methods = copy.deepcopy(config["methods"])
    regimes = add_sync_regime_methods(config)
    assert regimes == {"default_lr": ["dense_adam_bf16", "logra_bf16"],
                       "7b_lr": ["dense_adam_bf16_7b_lr", "logra_bf16_7b_lr"]}
    for name in ("dense_adam_bf16", "logra_bf16"):
        base, scaled = methods[name], config["methods"][f"{name}_7b_lr"]
        assert {k: v for k, v in scaled.items() if k != "options"} == \
            {k: v for k, v in base.items() if k != "options"}
        for key, value in base["options"].items():
            lr = key in ("lr", "update_ratio") or key.endswith("_lr")
            want = ({t: pytest.approx(v * 0.02) for t, v in value.items()}
                    if lr and isinstance(value, dict) else
                    pytest.approx(value * 0.02) if lr else value)
            assert scaled["options"][key] == want, (name, key)
    assert config["methods"]["dense_adam_bf16_7b_lr"]["options"]["lr"] == 1e-6  # not 1e-6 + ulp
    config = validate_file(ROOT / "config/config.yaml")
    config["methods"]["logra_bf16_7b_lr"] = {"rule": "logra"}
    with pytest.raises(ConfigError, match=r"sync_regime.lr_scales.7b_lr: the run name "
                                          r"'logra_bf16_7b_lr' is already a method"):
        add_sync_regime_methods(config)


def test_the_controller_ablation_switches_the_controller_at_each_step_size():
    """{controller on, off} x scales of the step: off, copies of the method with its step size
    (LoGRA's update_ratio, per task too) times the scale; on, with the KL budget on the
    stability task times the scale squared (what the controller does not absorb; the method
    itself at 1), its final budget in proportion; every other option its own; each cell runs
    on the stability task over opt_in_seeds; a rule without a controller is refused."""
    from logra.harness.plan import add_controller_ablation_methods, controller_runs
    config = validate_file(ROOT / "config/config.yaml")
    base = copy.deepcopy(config["methods"]["logra_stable_short"])
    names = add_controller_ablation_methods(config)
    assert names == ["logra_stable_short", "logra_stable_short_budget_x4",
                     "logra_stable_short_budget_x16", "logra_stable_short_nocontrol_x1",
                     "logra_stable_short_nocontrol_x2", "logra_stable_short_nocontrol_x4"]
    task, own = config["stability"]["task"], base["options"]
    for name, factor in zip(names[1:3], [4, 16]):
        options = config["methods"][name]["options"]
        assert options["controller"] is True
        mine_here = task_options(own, task)
        assert options["kl_budget"] == pytest.approx(mine_here["kl_budget"] * factor)
        assert options["kl_budget_final"] == pytest.approx(mine_here["kl_budget_final"] * factor)
        mine = ("kl_budget", "update_", "controller")
        assert {k: v for k, v in options.items() if not k.startswith(mine)} \
            == {k: v for k, v in own.items() if not k.startswith(mine)}
    for name, scale in zip(names[3:], [1, 2, 4]):
        options = config["methods"][name]["options"]
        assert options["controller"] is False
        for t in config["tasks"]:
            assert task_options(options, t)["update_ratio"] == pytest.approx(
                task_options(own, t)["update_ratio"] * scale)
        assert {k: v for k, v in options.items() if k not in ("controller", "update_ratio")} \
            == {k: v for k, v in own.items() if k != "update_ratio"}
    assert controller_runs(config)[:4] == [
        "countdown/logra_stable_short/seed0", "countdown/logra_stable_short/seed1",
        "countdown/logra_stable_short/seed2", "countdown/logra_stable_short_budget_x4/seed0"]
    assert len(controller_runs(config)) == 18
    config = validate_file(ROOT / "config/config.yaml")
    config["stability"]["controller_ablation"]["method"] = "dense_adam_stable"
    with pytest.raises(ConfigError, match=r"stability.controller_ablation.method: "
                                          r"'dense_adam_stable''s rule 'dense_adam' has no"):
        add_controller_ablation_methods(config)


def test_a_methods_rollout_keys_override_the_engines_for_its_runs():
    config = validate_file(ROOT / "config/config.yaml")
    bf16 = run_config(config, "arithmetic", "dense_adam_bf16", 0)["rollout"]
    assert bf16["dtype"] == "bfloat16" and bf16["sync"] == "delta"
    assert run_config(config, "arithmetic", "dense_adam", 0)["rollout"]["dtype"] == "float32"


def test_the_margin_is_set_by_the_sweeps_run_of_the_reference_at_its_configured_lr(tmp_path):
    """Each swept task's margin comes from the lr sweep's run of the reference at the lr the
    config gives it on that task; an lr off the grid is refused naming the key."""
    config = validate_file(ROOT / "config/config.yaml")
    sweep = grid_points(add_lr_sweep_methods(config))
    named = {lr: name for name, (m, lr) in sweep.items() if m == "dense_adam"}
    lrs = config["methods"]["dense_adam"]["options"]["lr"]
    assert margin_runs(config, sweep) == {t: named[lrs[t]] for t in config["lr_sweep"]["tasks"]}
    assert margin_seeds(config) == [13, 14, 15]  # after the grid's 0-4 and the sweep's 10-12
    config = copy.deepcopy(SMOKE)
    config["methods"]["dense_adam"]["options"]["lr"] = 3e-4
    base = validate_file(_write(tmp_path, config))
    config = copy.deepcopy(base)
    with pytest.raises(ConfigError, match=r"^methods.dense_adam.options.lr: dense_adam's lr on "
                                          r"arithmetic \(0.0003\) is not a point of its "
                                          r"lr_sweep grid \(1e-05, 0.0001, 0.001, 0.01\)"):
        margin_runs(config, grid_points(add_lr_sweep_methods(config)))
    # an adopted choice off the grid (a sweep about another anchor): named as the tuned value
    config = copy.deepcopy(base) | {"tuned": {"arithmetic": {"dense_adam": {"value": 3e-4}}}}
    with pytest.raises(ConfigError, match=r"^tuned.arithmetic.dense_adam.value: .*\(0.0003\) "
                                          r"is not a point .*adopt a choice of this grid"):
        margin_runs(config, grid_points(add_lr_sweep_methods(config)))


def choice(option: str, value: float) -> dict:
    """A grid's record (logra.analysis.tuning.choices) that chose `value`, inside its points."""
    return {"option": option, "value": value, "bracketed": True, "metric": "sampled",
            "seeds": [10, 11, 12], "scores": [[value / 2, 0.3], [value, 0.4], [value * 2, 0.3]]}


def test_scaling_tunes_at_the_first_size_and_transfers_to_the_others():
    """`scaling`: the sweep's points at the first size (the lr sweep's grid rule and anchors);
    no grid until every method is tuned; then dense AdamW's lr times first hidden / hidden,
    LoGRA's KL budget as tuned at every size, the rank-fraction variant at 43/256 of each
    hidden size (the fixed-rank method itself where they agree), the check's factors around
    the transferred values, every copy starting from its size's base."""
    from types import SimpleNamespace

    from logra.harness.plan import (add_scaling_methods, base_input, grid_values, scaling_grid,
                                    scaling_runs)
    config = validate_file(ROOT / "config/config.yaml")
    sc = config["scaling"]
    sizes = list(sc["sizes"])
    first = sc["sizes"][sizes[0]]["model"]["hidden_size"]
    untuned = add_scaling_methods(copy.deepcopy(config) | {"scaling": sc | {"tuned": {}}})
    assert untuned.grid == {} and untuned.check == {}
    with pytest.raises(ConfigError, match=r"scaling.tuned: not every method .* run `snakemake "
                                          r"scaling_sweep` and adopt its choices"):
        scaling_grid(config, untuned)  # the scaling target stops before any test run
    assert sorted(v for m, v in untuned.sweep.values() if m == "dense_adam") == list(
        grid_values(config["lr_sweep"]["anchors"]["dense_adam"], 6, 2, 1, 2).values())
    sc["tuned"] = {"dense_adam": choice("lr", 2.0e-4), "logra": choice("kl_budget", 8.0e-4)}
    s = add_scaling_methods(config)
    assert len(s.sweep) == 2 * (6 + 2 * 2)  # declared, and what the bracket rule may add
    for name, (method, value) in s.sweep.items():
        m = config["methods"][name]
        assert m["size"] == sizes[0] and m["grpo"]["measure_memory"] is False
        assert m["options"]["lr" if method == "dense_adam" else "kl_budget"] == value
    for size in sizes:
        hidden = sc["sizes"][size]["model"]["hidden_size"]
        dense = config["methods"][s.grid["dense_adam", size]]
        assert dense["size"] == size and "measure_memory" not in dense["grpo"]
        assert dense["options"]["lr"] == pytest.approx(2.0e-4 * first / hidden)
        logra = config["methods"][s.grid["logra", size]]["options"]
        assert logra["kl_budget"] == 8.0e-4 and logra["rank"] == 43
        frac = config["methods"][s.grid["logra_frac", size]]["options"]
        assert frac["rank"] == round(43 * hidden / 256)
        assert {k: v for k, v in frac.items() if k != "rank"} == {
            k: v for k, v in logra.items() if k != "rank"}
        assert (s.grid["logra_frac", size] == s.grid["logra", size]) == (hidden == 256)
        assert base_input(config, SimpleNamespace(task="countdown", method=s.grid[
            "logra", size], seed="1")) == {"base": f"results/base/countdown/{size}/seed1/model"}
    check = sc["check"]["size"]
    want = sorted((m, config["methods"][s.grid[m, check]]["options"][k] * f)
                  for m, k in (("dense_adam", "lr"), ("logra", "kl_budget"))
                  for f in sc["check"]["factors"])
    got = sorted(s.check.values())
    assert [m for m, _ in got] == [m for m, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want])
    assert s.grid["dense_adam", check] in s.check  # factor 1: the grid's method
    runs = scaling_runs(config, s)
    assert len(runs["grid"]) == len(set(s.grid.values())) * len(config["seeds"])
    assert {r.rsplit("seed", 1)[1] for r in runs["check"] + runs["sweep"]} == {
        str(x) for x in config["lr_sweep"]["seeds"]}
    assert len(runs["sweep"]) == 2 * 6 * len(config["lr_sweep"]["seeds"])  # declared points
    assert base_input(config, SimpleNamespace(task="countdown", seed="2")) == {
        "base": "results/base/countdown/seed2/model"}  # the grid's bases stay where they are


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["scaling"].update(methods=["logra", "dense_adam"]),
     r"scaling.methods: the first is the reference .* 'dense_adam' \(given: 'logra'\)"),
    (lambda c: c["scaling"]["check"].update(size="s9"),
     r"scaling.check.size: 's9' is not one of scaling.sizes \(s0, s1, s2\)"),
    (lambda c: c["scaling"].update(rank_fraction=["dense_adam"]),
     r"scaling.rank_fraction: 'dense_adam' is not one of scaling.methods with a `rank`"),
    (lambda c: c["scaling"]["transfer"].pop("logra"),
     r"scaling.methods\[1\]: 'logra' has no scaling.transfer rule"),
    (lambda c: c["scaling"]["sizes"]["s0"]["model"].update(hidden_size=32,
                                                            intermediate_size=32),
     r"methods.logra.options \(on scaling.sizes.s0\): .*rank"),
    (lambda c: c["scaling"].update(base_band=[0.4, 0.2]), r"scaling.base_band: \[0.4, 0.2\]"),
    (lambda c: c["scaling"].update(task="arithmetic"),
     r"scaling.task: 'arithmetic' is not one of lr_sweep.tasks"),
    (lambda c: c.pop("planner"), r"scaling.predict_models: .* \(`planner:`\), which this"),
    (lambda c: c["scaling"].update(tuned={"bogus": choice("lr", 1e-4)}),
     r"scaling.tuned.bogus: not one of scaling.methods \(dense_adam, logra\)"),
    (lambda c: c["scaling"].update(tuned={"dense_adam": choice("lr", 3e-4)}),
     r"scaling.tuned.dense_adam.value: 0.0003 is not a point of its grid"),
    (lambda c: c["scaling"].update(tuned={"logra": choice("lr", 2e-4)}),
     r"scaling.tuned.logra.option: 'lr', but the method's knob is 'kl_budget'"),
    (lambda c: c["scaling"].update(tuned={"logra": choice("kl_budget", 2e-4) | {
        "value": 4e-4}}), r"scaling.tuned.logra.value: 0.0004 is not the rule's choice"),
])
def test_scaling_config_errors_name_the_key(tmp_path, edit, message):
    """Each bad `scaling` key is named, read or planned (an adopted record is checked against
    its grid when the plan derives the grid)."""
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    edit(config)
    with pytest.raises(ConfigError, match=message):
        build_plan(validate_file(_write(tmp_path, config)), fit_rules=False)


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["study"].update(task="arithmetic"),
     r"study.task: 'arithmetic' is not one of lr_sweep.tasks"),
    (lambda c: c["study"].update(reference="logra"),
     r"study.reference: 'logra' is not one of study.arms \(dense_adam_study, "),
    (lambda c: c["study"]["arms"].update(bogus=1e-4), r"study.arms.bogus: not defined under methods"),
    (lambda c: c["study"]["horizons"]["h200"]["seeds"].update(min=40),
     r"study.horizons.h200.seeds: min 40 > max 32"),
    (lambda c: c["study"]["horizons"]["h80"].update(arms=["logra_study", "bogus"]),
     r"study.horizons.h80.arms: bogus not among study.arms"),
    (lambda c: c["study"]["horizons"]["h80"].update(arms=["logra_study", "dense_adam_targets_study"]),
     r"study.horizons.h80.arms: leaves out the reference 'dense_adam_study'"),
    (lambda c: c["study"]["horizons"]["h200"].update(snapshot=200),
     r"study.horizons.h200.snapshot: 200, not before the horizon's last update \(200\)"),
    (lambda c: c.pop("stability"), r"study: needs stability.criterion \(its collapse.prompts"),
    (lambda c: c["study"]["horizons"]["h200"].update(stability={"every": 30}),
     r"study.horizons.h200.snapshot: 80, not a multiple of study.horizons.h200.stability.every "
     r"\(30\)"),
    (lambda c: c["study"]["horizons"]["h1100"].update(halving={"keep": 0}),
     r"study.horizons.h1100.halving.keep: 0 is less than the minimum of 1"),
])
def test_study_config_errors_name_the_key(tmp_path, edit, message):
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    edit(config)
    with pytest.raises(ConfigError, match=message):
        validate_file(_write(tmp_path, config))


def _adopted(config: dict, arm: str, point: float, **change) -> dict:
    """study.tuned.<arm>_<horizon>: a record of `point` as results/study/tuned/<arm>_<horizon>
    .yaml writes it (the point's method config as the plan derives it), with `change` over it."""
    plan = build_plan(validate_file(ROOT / "config/config.yaml"))
    name = next(n for n, (a, v) in plan.grids["study"][arm].points().items() if v == point)
    seeds = config["lr_sweep"]["seeds"]
    return {"option": "lr", "value": point, "bracketed": True, "metric": "sampled",
            "val_accuracy": 0.3, "by_seed": dict.fromkeys(seeds, 0.3),
            "scores": [[point / 2, 0.25], [point, 0.3], [point * 2, 0.2]],
            "config": plan.config["methods"][name]} | change


ARM = "dense_adam_study_h80"


@pytest.mark.parametrize("arm, change, message", [
    ("dense_adam_study", {}, r"study.tuned.dense_adam_study: not an arm at a horizon "
                             r"\(<arm>_<horizon>: dense_adam_study_h1100, "),
    (ARM, {"metric": "greedy"},
     rf"study.tuned.{ARM}.metric: chosen by 'greedy', but eval.primary is 'sampled'"),
    (ARM, {"by_seed": {0: 0.3, 1: 0.3, 2: 0.3}},
     rf"study.tuned.{ARM}.by_seed: chosen on seeds \[0, 1, 2\], not lr_sweep.seeds"),
    (ARM, {"value": 3e-5, "scores": [[1.5e-5, 0.2], [3e-5, 0.3], [6e-5, 0.2]]},
     rf"study.tuned.{ARM}.value: 3e-05 is not a point of its grid \(3.125e-06, "),
    # the record is its grid's rule's choice among its own scores, its types as written
    (ARM, {"value": 2e-4},
     rf"study.tuned.{ARM}.value: 0.0002 is not the rule's choice among its scores: "
     r"0.0001 scores 0.3"),
    (ARM, {"bracketed": False},
     rf"study.tuned.{ARM}.bracketed: False, but its value 0.0001 is inside"),
    (ARM, {"scores": [["5e-5", "0.25"], [1e-4, 0.3]]},
     rf"study.tuned.{ARM}.scores: .* is not a list of \[value, accuracy or null\]"),
    (ARM, {"by_seed": {"10": 0.3, "11": 0.3, "12": 0.3}},
     rf"study.tuned.{ARM}.by_seed: .* is not a map of seed \(an integer, unquoted\)"),
    # successive halving: the choice among the points run on every seed (a point screened
    # out scored higher on its one seed); the screened ones count for its position
    (ARM, {"scores": [[1e-4, 0.3], [2e-4, 0.2]], "screen": [[5e-5, 0.9]], "bracketed": False},
     rf"study.tuned.{ARM}.bracketed: False, but its value 0.0001 is inside"),
    (ARM, {"screen": [[5e-5, "0.9"]]},
     rf"study.tuned.{ARM}.screen: .* is not a list of \[value, accuracy or null\] pairs"),
    (ARM, {"val_accuracy": 0.5},
     rf"study.tuned.{ARM}.val_accuracy: 0.5 is not the mean of its by_seed"),
    (ARM, "schedule",
     rf"study.tuned.{ARM}: chosen under another config of {ARM}_lr0p0001 "
     r"\(it differs in grpo\): remove the entry"),
])
def test_an_adopted_study_choice_must_still_match_its_grid(tmp_path, arm, change, message):
    """An arm's adopted choice at a horizon (study.tuned) is an arm's there, made by the primary
    metric on the lr sweep's seeds, a point of its grid, under the method config that point
    has now (a changed schedule rule changes it): else the config stops, naming the key."""
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    record = _adopted(config, ARM, 1e-4, **({} if change == "schedule" else change))
    if change == "schedule":  # the horizons' schedule rule changed after the choice
        config["study"]["schedule"]["warmup"] = 0.1
    config["study"]["tuned"] = {arm: record}
    with pytest.raises(ConfigError, match=message):
        build_plan(validate_file(_write(tmp_path, config)))


def test_a_choice_by_successive_halving_is_adopted_with_its_screen(tmp_path):
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    config["study"]["tuned"] = {ARM: _adopted(config, ARM, 1e-4, screen=[[5e-5, 0.9]],
                                              scores=[[1e-4, 0.3], [2e-4, 0.2]])}
    build_plan(validate_file(_write(tmp_path, config)))


def test_an_adopted_arm_does_not_run_its_grid_again(tmp_path):
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    config["study"]["tuned"] = {"logra_study_h80": _adopted(config, "logra_study_h80", 8e-4,
                                                             option="kl_budget")}
    plan = build_plan(validate_file(_write(tmp_path, config)))
    assert plan.runs["study_sweep"] and not [r for r in plan.runs["study_sweep"]
                                             if "/logra_study_h80_" in r]
    assert [r for r in plan.runs["study_sweep"] if "/logra_study_h1100_" in r]
    assert plan.grids["study"]["logra_study_h80"].points()  # its points still name its choice


@pytest.mark.parametrize("steps, warmup, decay", [(80, 4, 120), (200, 9, 300), (1100, 50, 1650),
                                                  (100, 5, 150)])
def test_each_horizon_scales_the_authors_schedule(steps, warmup, decay):
    """study.schedule's rule at a horizon of `steps` updates: dense AdamW warms up over 4.5%
    and decays to a tenth over 1.5x the horizon, LoGRA's KL budget spans 1.5x it (its own
    schedule, no lr schedule), both run `steps` updates: the default's 4/120 at 80, the
    authors' 9/300 at 200, the stability runs' 1,650 at 1,100; a half rounds up (4.5 at 100)."""
    from logra.harness.horizons import horizon_method
    config = resolve([])
    rule = config["study"]["schedule"]
    dense = horizon_method(config["methods"]["dense_adam_study"], steps, rule, None)
    assert dense["grpo"] == {"steps": steps, "warmup_steps": warmup, "decay_steps": decay,
                             "decay_final": 0.1}
    logra = horizon_method(config["methods"]["logra_study"], steps, rule, 40)
    assert logra["grpo"] == {"steps": steps, "snapshot_every": 40}
    # a method's own schedule and snapshot are replaced, not kept beside the rule's
    for name in ("dense_adam_stable", "logra_stable"):
        again = horizon_method(config["methods"][name], steps, rule, None)
        assert again["grpo"] == (dense if name == "dense_adam_stable" else {
            **logra, "grpo": {"steps": steps}})["grpo"] | {"checkpoint_every": 100}
    assert logra["options"]["schedule_steps"] == decay
    assert logra["options"] == config["methods"]["logra_study"]["options"] | {
        "schedule_steps": decay}
    plan = build_plan(config, fit_rules=False)
    if f"h{steps}" in config["study"]["horizons"]:
        assert plan.config["methods"][f"dense_adam_study_h{steps}"]["grpo"]["decay_steps"] == decay
    # 1,100 updates judge a stability curve: every run there (its grid's too) snapshots
    # every 100 updates
    assert {m["grpo"]["snapshot_every"] for n, m in plan.config["methods"].items()
            if "_study_h1100" in n} == {100}


def test_the_study_grids_are_the_lr_sweeps_rule_about_each_arms_anchor():
    """Each arm's grid at each horizon has the lr sweep's points and spacing about its anchor
    (LoGRA's budget by the square), each point the arm on the horizon's schedule at that value
    of its knob (LoGRA's update_ratio following), measuring its memory (the test runs report
    peaks); the test seeds skip every seed that chose a value or set a margin."""
    from logra.harness.plan import grid_values, study_seeds
    plan = build_plan(validate_file(ROOT / "config/config.yaml"))
    config, spec = plan.config, plan.config["lr_sweep"]
    horizons = plan.study_horizons
    assert list(horizons["h200"]) == list(config["study"]["arms"])
    for h, arms in horizons.items():
        for arm, method in arms.items():
            anchor = config["study"]["arms"][arm]
            grid = plan.grids["study"][method]
            power = 2 if arm.startswith("logra") else 1
            assert grid.values == grid_values(anchor, spec["points"], spec["factor"], power,
                                              spec["extend"])
            for name, (_, value) in grid.points().items():
                m = config["methods"][name]
                assert name.startswith(f"{arm}_{h}_lr")
                assert plan.derived[name] == plan.derived[method] == f"study.horizons.{h}"
                assert m["grpo"] == config["methods"][method]["grpo"]
                assert m["grpo"]["steps"] == int(h[1:])
                assert m["options"][plan.sweep_knobs[method]] == value
    point = config["methods"]["logra_study_h200_lr0p0032"]["options"]
    assert point["update_ratio"] == pytest.approx(3e-3 * (0.0032 / 2e-4) ** 0.5)
    # the first rounds: every declared point on every validation seed, but under successive
    # halving (1,100 updates) on the first only
    first = {h: len(spec["seeds"][:1] if config["study"]["horizons"][h].get("halving")
                    else spec["seeds"]) for h in horizons}
    assert config["study"]["horizons"]["h1100"]["halving"] == {"keep": 2}
    assert len(plan.runs["study_sweep"]) == sum(
        first[h] * spec["points"] for h, arms in horizons.items() for m in arms.values()
        if m not in config["study"]["tuned"])
    assert {r.rsplit("/seed", 1)[1] for r in plan.runs["study_sweep"] if "_h1100_" in r} == {
        str(spec["seeds"][0])}
    taken = set(spec["seeds"]) | set(plan.margin_seeds)
    seeds = study_seeds(config, 24)
    assert len(seeds) == 24 and not taken & set(seeds) and seeds == sorted(seeds)


def test_a_derived_run_is_checked_like_a_written_one(tmp_path):
    """The plan checks every method it derives as a written one: a scaling size whose
    intermediate size holds LoGRA's configured rank (43) but not its rank fraction there
    (86 at hidden 512) passes the written config's checks and stops at the plan, naming the
    size, the run and the module, before any job. On the default config (with its adopted
    choices: config/tuned.yaml) every derived run names the key that made it."""
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    config["scaling"]["sizes"]["s2"]["model"]["intermediate_size"] = 64
    config["scaling"]["tuned"] = yaml.safe_load((ROOT / "config/tuned.yaml").read_text())[
        "scaling"]["tuned"]  # the scaling grid is derived once every method has its choice
    written = validate_file(_write(tmp_path, config))  # the written methods fit every size
    with pytest.raises(ConfigError, match=r"scaling.sizes.s2: its run 'logra_frac_s2' cannot "
                                          r"work: methods.logra_frac_s2.options \(on "
                                          r"scaling.sizes.s2\): rank=86 exceeds"):
        build_plan(written)
    plan = build_plan(resolve([]))
    assert set(plan.derived) == set(plan.config["methods"]) - set(resolve([])["methods"])
    assert plan.derived["logra_frac_s2"] == "scaling.sizes.s2"
    assert plan.derived["dense_adam_lr0p0001"] == "lr_sweep.anchors.dense_adam"
    assert plan.derived["logra_stable_short_nocontrol_x2"] == "stability.controller_ablation"
    assert plan.derived["logra_stable_short_budget_x16"] == "stability.controller_ablation"


@pytest.mark.parametrize("source, message", [
    ("import sys\nsys.exit(0)\n", r"task_files: importing .*exits.py raised SystemExit: 0"),
    ("from logra.rl.tasks import ArithmeticTask, register_task\n\n\n@register_task\n"
     "class Mine(ArithmeticTask):\n    name = 'arithmetic'\n",
     r"task_files: importing .*exits.py raised ValueError: a task named 'arithmetic' is already "
     r"registered \(logra.rl.tasks.synthetic.ArithmeticTask\); Mine needs a name of its own"),
    (None, r"task_files: .*exits.py is not a file"),
])
def test_a_task_file_that_fails_to_import_is_a_config_error_naming_it(tmp_path, monkeypatch,
                                                                       source, message):
    """A task file that exits, re-registers a built-in task or is missing stops the config check
    naming the file and the config that listed it (SystemExit used to end Snakemake with rc 0,
    nothing built; the others were named only as the Snakefile's line)."""
    from logra.rl.tasks import TASK_FILES_ENV
    monkeypatch.delenv(TASK_FILES_ENV, raising=False)
    if source is not None:
        (tmp_path / "exits.py").write_text(source)
    config = copy.deepcopy(SMOKE) | {"task_files": [str(tmp_path / "exits.py")]}
    path = _write(tmp_path, config)
    with pytest.raises(ConfigError, match=message + rf".* \(set by {path}\)"):
        resolve([path], default=None)


def test_a_config_whose_aliases_expand_past_the_bound_is_refused_before_the_schema(tmp_path):
    """Seven levels of aliases, ten copies each (398 bytes of YAML, 10 million values once
    expanded), inside rollout.options: refused at once naming the key and the file."""
    import time
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
        f"*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 7)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(["rollout:", "  options:", "    bomb:",
                                *("      " + line for line in lines), ""]))
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"config: rollout.options.bomb.a\d expands to more than "
                                          r"100,000 values \(YAML anchors .*\(set by "
                                          r".*bomb.yaml\)"):
        resolve([path])
    assert time.perf_counter() - start < 5


def test_an_overlay_grpo_key_that_a_method_overrides_is_named(tmp_path, capsys):
    """`grpo: {steps: 2}` in an overlay shortens every run but those whose method sets its own
    grpo.steps: each is named, once, by the check in full; a method that the overlay itself
    sets is not."""
    overlay = tmp_path / "short.yaml"
    overlay.write_text("grpo: {steps: 2}\nmethods: {dense_adam_bf16: {grpo: {steps: 2}}}\n")
    resolve([overlay], fit_rules=False)
    assert capsys.readouterr().err == ""
    resolve([overlay])
    err = capsys.readouterr().err
    assert re.search(r"note: grpo.steps=2 \(.*short.yaml\) does not reach the methods that set "
                     r"their own grpo.steps: .*logra_bf16 \(20\), logra_stable \(1100\)", err)
    assert "dense_adam_bf16" not in err and err.count("\n") == 1


def test_an_overlay_into_one_method_leaves_a_method_sharing_its_yaml_anchor(tmp_path):
    """dense_adam_bf16 and logra_bf16 share one YAML anchor (`grpo: *regime`): an overlay that
    shortens the first leaves the second's steps as config.yaml sets them."""
    overlay = tmp_path / "one.yaml"
    overlay.write_text("methods: {dense_adam_bf16: {grpo: {steps: 2}}}\n")
    config = resolve([overlay], fit_rules=False)
    assert config["methods"]["dense_adam_bf16"]["grpo"]["steps"] == 2
    assert config["methods"]["logra_bf16"]["grpo"]["steps"] == resolve(
        [], fit_rules=False)["methods"]["logra_bf16"]["grpo"]["steps"] == 20
