"""lm-eval on checkpoints: the task files per protocol, the JSON summary, parity with our own
greedy generation + reward, seeded sampling whose scores are our reward's, and a checkpoint that
really answers (accuracy 1.0)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from logra.files import read_jsonl, write_jsonl
from logra.harness.evaluate import PROTOCOLS, evaluate, write_lmeval_task
from logra.rl.models import build_tiny, load
from logra.rl.tasks import get_task

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
MAX_GEN = 16
SMALL = {"greedy": {"samples": 1, "temperature": 0},
         "sampled": {"samples": 3, "temperature": 0.7, "top_p": 0.7}}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A random tiny checkpoint and lm-eval tasks over 8 arithmetic test examples.

    Half the prompts are 1-digit and half 2-digit questions, so lm-eval's batches are
    left-padded: parity with unbatched generation then checks padding too.
    """
    root = tmp_path_factory.mktemp("eval")
    model_dir = build_tiny(root / "m", **TINY)
    examples = (get_task("arithmetic", digits=1).splits(seed=1, n_train=0, n_test=4)["test"]
                + get_task("arithmetic").splits(seed=0, n_train=0, n_test=4)["test"])
    write_jsonl(root / "test.jsonl", examples)
    yamls = write_lmeval_task("arithmetic", {}, root / "test.jsonl", root / "task", SMALL,
                              max_gen_toks=MAX_GEN)
    return root, model_dir, yamls


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
    root, _, yamls = setup
    assert yamls == {p: root / "task" / f"logra_arithmetic_{p}.yaml" for p in SMALL}
    text = yamls["greedy"].read_text()
    assert "process_results: !function logra_arithmetic_utils.process_results" in text
    configs = {p: yaml.load(y.read_text().replace("!function", ""), Loader=yaml.SafeLoader)
               for p, y in yamls.items()}
    greedy_, sampled = configs["greedy"], configs["sampled"]
    assert greedy_["task"] == "logra_arithmetic_greedy"
    assert greedy_["dataset_kwargs"]["data_files"]["test"] == str((root / "test.jsonl").resolve())
    assert greedy_["generation_kwargs"] == {"until": ["\n"], "do_sample": False,
                                            "max_gen_toks": MAX_GEN}
    assert greedy_["repeats"] == 1 and sampled["repeats"] == 3
    assert sampled["generation_kwargs"] == {"until": ["\n"], "do_sample": True,
                                            "temperature": 0.7, "top_p": 0.7, "top_k": 0,
                                            "max_gen_toks": MAX_GEN}
    assert sampled["filter_list"] == [{"name": "samples", "filter": [
        {"function": "take_first_k", "k": 3}]}]
    # the fields themselves, verbatim (a Jinja template would be compiled once per problem)
    assert greedy_["doc_to_text"] == "prompt" and greedy_["doc_to_target"] == "answer"
    assert [m["metric"] for m in greedy_["metric_list"]] == ["acc", "pass"]
    # options (with tuples) are embedded as a literal and reach get_task
    linear = write_lmeval_task("linear", {"x_range": (0, 5)}, root / "test.jsonl", root / "task")
    assert "get_task('linear', **{'x_range': (0, 5)})" in (
        root / "task" / "logra_linear_utils.py").read_text()
    assert set(linear) == set(PROTOCOLS) and linear["greedy"] != yamls["greedy"]


def test_write_task_rejects_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_lmeval_task("arithmetic", {}, tmp_path / "missing.jsonl", tmp_path / "t")
    (tmp_path / "x.jsonl").write_text("{}\n")
    with pytest.raises(ValueError):
        write_lmeval_task("arithmetic", {"f": object()}, tmp_path / "x.jsonl", tmp_path / "t")


def test_evaluate_writes_json(setup, tmp_path):
    root, model_dir, yamls = setup
    out_json = tmp_path / "sub" / "eval.json"
    summary = evaluate(model_dir, yamls["greedy"].parent, "arithmetic", out_json, SMALL,
                       "sampled", batch_size=3)
    assert out_json.exists()
    assert json.loads(out_json.read_text()) == summary
    assert summary["task"] == "arithmetic" and summary["n"] == 8
    assert summary["primary"] == "sampled"
    assert summary["accuracy"] == summary["metrics"]["sampled"]["accuracy"]
    assert summary["lm_eval_version"] and set(summary["metrics"]) == set(SMALL)
    for p in summary["problems"]:
        assert len(p["greedy"]["responses"]) == 1 and len(p["sampled"]["responses"]) == 3
        assert p["sampled"]["pass"] >= p["sampled"]["acc"]
    assert not list(out_json.parent.glob(".*.tmp"))
    limited = evaluate(model_dir, yamls["greedy"].parent, "logra_arithmetic", tmp_path / "l.json",
                       SMALL, "greedy", limit=2)
    assert limited["n"] == 2 and limited["primary"] == "greedy"
    with pytest.raises(ValueError, match="eval.primary: 't1' is not a protocol"):
        evaluate(model_dir, yamls["greedy"].parent, "arithmetic", tmp_path / "x.json", SMALL,
                 "t1")
    with pytest.raises(FileNotFoundError, match="logra_arithmetic_t1.yaml"):
        evaluate(model_dir, yamls["greedy"].parent, "arithmetic", tmp_path / "x.json", PROTOCOLS)


def test_parity_with_own_generation_and_reward(setup, tmp_path):
    """lm-eval's greedy responses == our greedy generation; every protocol's per-problem acc
    and pass == the mean and max of our reward over its responses; accuracy == their mean."""
    root, model_dir, yamls = setup
    summary = evaluate(model_dir, yamls["greedy"].parent, "arithmetic", tmp_path / "e.json",
                       SMALL, batch_size=3)
    examples = read_jsonl(root / "test.jsonl")
    model, tokenizer = load(model_dir)
    task = get_task("arithmetic")
    ours = [greedy(model, tokenizer, ex["prompt"], MAX_GEN) for ex in examples]
    problems = summary["problems"]
    assert [p["prompt"] for p in problems] == [ex["prompt"] for ex in examples]
    assert [p["greedy"]["responses"] for p in problems] == [[o] for o in ours]
    for protocol in SMALL:
        rewards = [[task.reward(c, ex) for c in p[protocol]["responses"]]
                   for p, ex in zip(problems, examples)]
        assert [p[protocol]["acc"] for p in problems] == pytest.approx(
            [sum(r) / len(r) for r in rewards])
        assert [p[protocol]["pass"] for p in problems] == [max(r) for r in rewards]
        assert summary["metrics"][protocol]["accuracy"] == pytest.approx(
            sum(p[protocol]["acc"] for p in problems) / len(problems))


def test_sampling_is_seeded(setup, tmp_path):
    """The same seed draws the same samples; another seed other ones (a random model's
    completions at temperature 0.7 are far from deterministic)."""
    _, model_dir, yamls = setup
    def responses(seed, name):
        out = evaluate(model_dir, yamls["greedy"].parent, "arithmetic", tmp_path / name, SMALL,
                       seed=seed, batch_size=4)
        return [p["sampled"]["responses"] for p in out["problems"]]
    first = responses(3, "a.json")
    assert responses(3, "b.json") == first
    assert responses(4, "c.json") != first


def overfit(task, examples, out_dir) -> Path:
    """A tiny model trained until its greedy completion of every example is the task's target
    (then eos); saved in `out_dir`."""
    model, tokenizer = load(build_tiny(out_dir / "init", **TINY))
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
    assert nll.max().item() < 0.05, f"tiny model failed to overfit {len(rows)} examples"
    model.eval()
    model.save_pretrained(out_dir / "fit")
    tokenizer.save_pretrained(out_dir / "fit")
    return out_dir / "fit"


def test_overfit_checkpoint_scores_one(tmp_path):
    """A tiny model overfit on 4 examples answers them all: lm-eval accuracy is 1.0."""
    start = time.time()
    task = get_task("arithmetic")
    examples = task.splits(seed=3, n_train=0, n_test=4)["test"]
    write_jsonl(tmp_path / "test.jsonl", examples)
    yamls = write_lmeval_task("arithmetic", {}, tmp_path / "test.jsonl", tmp_path / "task",
                              SMALL, max_gen_toks=8)
    summary = evaluate(overfit(task, examples, tmp_path), yamls["greedy"].parent, "arithmetic",
                       tmp_path / "e.json", SMALL, "greedy")
    assert [p["greedy"]["responses"] for p in summary["problems"]] == [
        [ex["answer"] for ex in examples][i:i + 1] for i in range(4)]
    assert summary["accuracy"] == 1.0 and summary["n"] == 4
    assert summary["metrics"]["greedy"]["scores"] == {}  # arithmetic has no extra scores
    assert set(summary["problems"][0]["greedy"]) == {"responses", "acc", "pass"}
    assert time.time() - start < 30


# GSM8K solutions whose final number (the reward's) and math-verify's reading agree, or not:
# math-verify reads an answer after "the answer is" before the last number
GSM8K_ROWS = [{"question": "2+5?", "answer": "#### 7"},
              {"question": "Eggs in 2 dozen?", "answer": "the answer is 2 dozen\n#### 24"},
              {"question": "9-4?", "answer": "9-4=<<9-4=5>>5\n#### 5"}]


def test_gsm8k_evaluation_reports_math_verify_beside_exact_match(tmp_path):
    """A model overfit on GSM8K solutions answers with them: exact match on the final number
    scores all three, math-verify two; both reach the summary, per problem and per protocol."""
    path = tmp_path / "gsm8k.jsonl"
    write_jsonl(path, GSM8K_ROWS)
    task = get_task("gsm8k", train_path=path, test_path=path)
    examples = task.splits(seed=0, n_train=0, n_test=None)["test"]
    write_jsonl(tmp_path / "test.jsonl", examples)
    yamls = write_lmeval_task("gsm8k", {}, tmp_path / "test.jsonl", tmp_path / "task", SMALL,
                              max_gen_toks=40)
    config = yaml.load(yamls["greedy"].read_text().replace("!function", ""),
                       Loader=yaml.SafeLoader)
    assert [m["metric"] for m in config["metric_list"]] == [
        "acc", "pass", "acc_math_verify", "pass_math_verify"]
    summary = evaluate(overfit(task, examples, tmp_path), yamls["greedy"].parent, "gsm8k",
                       tmp_path / "e.json", SMALL, "greedy")
    greedy = [p["greedy"] for p in summary["problems"]]
    assert [g["responses"] for g in greedy] == [[task.target(ex)] for ex in examples]
    assert [(g["acc"], g["acc_math_verify"], g["pass_math_verify"]) for g in greedy] == [
        (1.0, 1.0, 1.0), (1.0, 0.0, 0.0), (1.0, 1.0, 1.0)]
    assert summary["accuracy"] == 1.0
    assert summary["metrics"]["greedy"]["scores"] == {
        "math_verify": {"accuracy": pytest.approx(2 / 3), "pass_at_k": pytest.approx(2 / 3)}}
    for p, ex in zip(summary["problems"], examples):  # the sampled protocol: task.scores too
        values = [task.scores(c, ex)["math_verify"] for c in p["sampled"]["responses"]]
        assert p["sampled"]["acc_math_verify"] == pytest.approx(sum(values) / len(values))
        assert p["sampled"]["pass_math_verify"] == max(values)
