"""lm-eval on checkpoints: the task files, the JSON summary, parity with our own greedy
generation + reward, and a checkpoint that really answers (accuracy 1.0)."""
from __future__ import annotations

import json
import time

import pytest
import torch
import torch.nn.functional as F
import yaml

from logra.harness.evaluate import evaluate, write_lmeval_task
from logra.rl.models import build_tiny, load
from logra.rl.tasks import get_task, read_jsonl, write_jsonl

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
MAX_GEN = 16


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A random tiny checkpoint and an lm-eval task over 8 arithmetic test examples.

    Half the prompts are 1-digit and half 2-digit questions, so lm-eval's batches are
    left-padded: parity with unbatched generation then checks padding too.
    """
    root = tmp_path_factory.mktemp("eval")
    model_dir = build_tiny(root / "m", **TINY)
    examples = (get_task("arithmetic", digits=1).splits(seed=1, n_train=0, n_test=4)["test"]
                + get_task("arithmetic").splits(seed=0, n_train=0, n_test=4)["test"])
    write_jsonl(root / "test.jsonl", examples)
    task_yaml = write_lmeval_task("arithmetic", {}, root / "test.jsonl", root / "task",
                                  max_gen_toks=MAX_GEN)
    return root, model_dir, task_yaml


def greedy(model, tokenizer, prompt: str, max_new_tokens: int) -> str:
    """The project's own greedy completion: decoded without specials, cut at the first newline."""
    enc = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                             eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return text.split("\n", 1)[0]


def test_task_files(setup):
    root, _, task_yaml = setup
    assert task_yaml == root / "task" / "logra_arithmetic.yaml"
    text = task_yaml.read_text()
    assert "process_results: !function logra_arithmetic_utils.process_results" in text
    config = yaml.load(text.replace("!function", ""), Loader=yaml.SafeLoader)
    assert config["task"] == "logra_arithmetic"
    assert config["dataset_kwargs"]["data_files"]["test"] == str((root / "test.jsonl").resolve())
    assert config["generation_kwargs"] == {"until": ["\n"], "do_sample": False,
                                           "max_gen_toks": MAX_GEN}
    assert config["doc_to_text"] == "{{prompt}}" and config["doc_to_target"] == "{{answer}}"
    assert config["metric_list"] == [{"metric": "acc", "aggregation": "mean",
                                      "higher_is_better": True}]
    # options (with tuples) are embedded as a literal and reach get_task
    linear_yaml = write_lmeval_task("linear", {"x_range": (0, 5)}, root / "test.jsonl",
                                    root / "task")
    assert "get_task('linear', **{'x_range': (0, 5)})" in (
        root / "task" / "logra_linear_utils.py").read_text()
    assert task_yaml.exists() and linear_yaml != task_yaml


def test_write_task_rejects_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_lmeval_task("arithmetic", {}, tmp_path / "missing.jsonl", tmp_path / "t")
    (tmp_path / "x.jsonl").write_text("{}\n")
    with pytest.raises(ValueError):
        write_lmeval_task("arithmetic", {"f": object()}, tmp_path / "x.jsonl", tmp_path / "t")


def test_evaluate_writes_json(setup, tmp_path):
    root, model_dir, task_yaml = setup
    out_json = tmp_path / "sub" / "eval.json"
    summary = evaluate(model_dir, task_yaml.parent, "arithmetic", out_json, batch_size=3)
    assert out_json.exists()
    assert json.loads(out_json.read_text()) == summary
    assert summary["task"] == "logra_arithmetic" and summary["n"] == 8
    assert 0.0 <= summary["accuracy"] <= 1.0
    assert summary["lm_eval_version"] and "acc,none" in summary["results"]
    assert [set(s) >= {"prompt", "response", "answer", "acc"} for s in summary["samples"]]
    assert not list(out_json.parent.glob(".*.tmp"))
    limited = evaluate(model_dir, task_yaml.parent, "logra_arithmetic", tmp_path / "l.json",
                       limit=2)
    assert limited["n"] == 2


def test_parity_with_own_generation_and_reward(setup, tmp_path):
    """lm-eval's responses == our greedy generation; accuracy == mean of our reward."""
    root, model_dir, task_yaml = setup
    summary = evaluate(model_dir, task_yaml.parent, "arithmetic", tmp_path / "e.json",
                       batch_size=3)
    examples = read_jsonl(root / "test.jsonl")
    model, tokenizer = load(model_dir)
    task = get_task("arithmetic")
    ours = [greedy(model, tokenizer, ex["prompt"], MAX_GEN) for ex in examples]
    assert [s["prompt"] for s in summary["samples"]] == [ex["prompt"] for ex in examples]
    assert [s["response"] for s in summary["samples"]] == ours
    rewards = [task.reward(c, ex) for c, ex in zip(ours, examples)]
    assert [s["acc"] for s in summary["samples"]] == rewards
    assert summary["accuracy"] == pytest.approx(sum(rewards) / len(rewards))


def test_overfit_checkpoint_scores_one(tmp_path):
    """A tiny model overfit on 4 examples answers them all: lm-eval accuracy is 1.0."""
    start = time.time()
    task = get_task("arithmetic")
    examples = task.splits(seed=3, n_train=0, n_test=4)["test"]
    write_jsonl(tmp_path / "test.jsonl", examples)
    task_yaml = write_lmeval_task("arithmetic", {}, tmp_path / "test.jsonl", tmp_path / "task",
                                  max_gen_toks=8)
    model, tokenizer = load(build_tiny(tmp_path / "init", **TINY))
    rows = [(tokenizer(ex["prompt"])["input_ids"],
             tokenizer(task.target(ex))["input_ids"] + [tokenizer.eos_token_id])
            for ex in examples]
    width = max(len(p) + len(t) for p, t in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)  # loss on target + eos only
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, t) in enumerate(rows):  # right-padded
        ids[i, :len(p) + len(t)] = torch.tensor(p + t)
        labels[i, len(p):len(p) + len(t)] = torch.tensor(t)
        mask[i, :len(p) + len(t)] = 1
    target = labels[:, 1:].reshape(-1)
    scored = target != -100
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(300):  # typically ~50 steps
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target,
                              reduction="none", ignore_index=-100)[scored]
        if nll.max().item() < 0.05:  # every target token (and eos) is the clear argmax
            break
        optimizer.zero_grad()
        nll.mean().backward()
        optimizer.step()
    assert nll.max().item() < 0.05, "tiny model failed to overfit 4 examples"
    model.eval()
    model.save_pretrained(tmp_path / "fit")
    tokenizer.save_pretrained(tmp_path / "fit")
    summary = evaluate(tmp_path / "fit", task_yaml.parent, "arithmetic", tmp_path / "e.json")
    assert [s["response"] for s in summary["samples"]] == [ex["answer"] for ex in examples]
    assert summary["accuracy"] == 1.0 and summary["n"] == 4
    assert time.time() - start < 30
