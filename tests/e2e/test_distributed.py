"""FSDP: a 2-rank run under torchrun (gloo, CPU) against the same run in one process.

The 2-rank run uses micro-batch 4 per rank, i.e. the same global micro-batches of 8 sequences
as the single-process run with micro-batch 8, so both compute the same gradients, summed in a
different order. LoGRA runs with its controller (a forward-mode JVP through the sharded model)
and a new projection every step, its sketch summed over the ranks; Sketch-Adam with
`side: right` in both (what sharding chooses), with refreshes (steps 1 and 4), KL control (its
side branches gather C); every run with a full resync and a drift check.
"""
import json
import math
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from conftest import ROOT
from runs import make_run, weights

from logra.rl.loop import train
from logra.rl.models import load

pytestmark = pytest.mark.e2e  # README: `pytest -m "not e2e"` leaves these out

# |W_fsdp - W_single| / max |W_single - W_base|, after 6 steps (float32: summation order)
TOLERANCE = 1e-3

METHODS = {
    "dense_adam": {"rule": "dense_adam", "options": {"lr": 1.0e-3}},
    "galore": {"rule": "galore", "options": {"lr": 1.0e-3, "rank": 2, "update_proj_gap": 3}},
    "logra": {"rule": "logra", "options": {"rank": 2, "update_ratio": 1.0e-2,
                                           "probe_responses": 2}},
    "sketch_adam": {"rule": "sketch_adam", "options": {"lr": 1.0e-2, "rank": 2,
                                                       "refresh_every": 3, "side": "right"},
                    "kl_control": {"target": 1.0e-2}},
}


def torchrun(cfg, base, train_jsonl, out):
    out.mkdir(parents=True)
    (out / "run_config.json").write_text(json.dumps(cfg))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(ROOT / "tests/e2e/fsdp_worker.py"), str(out / "run_config.json"), str(base),
         str(train_jsonl), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("method", ["dense_adam", "logra", "sketch_adam", "galore"])
def test_two_rank_fsdp_matches_one_process(tmp_path, tiny_dir, method, monkeypatch):
    import runs
    monkeypatch.setitem(runs.METHODS, method, METHODS[method])
    cfg, train_jsonl = make_run(tmp_path, method, prompts_per_step=4, group_size=4,
                                micro_batch_size=8, probe_size=8)
    single = train(cfg, tiny_dir, train_jsonl, tmp_path / "single")
    cfg["grpo"].update(micro_batch_size=4, nproc_per_node=2)
    sharded = torchrun(cfg, tiny_dir, train_jsonl, tmp_path / "fsdp")

    assert sharded["status"] == single["status"] == "ok"
    assert sharded["nproc_per_node"] == 2 and single["nproc_per_node"] == 1
    # the same rollouts and rewards at every step, the same KL control decisions
    a, b = pd.read_csv(tmp_path / "single/metrics.csv"), pd.read_csv(tmp_path / "fsdp/metrics.csv")
    pd.testing.assert_series_equal(a["reward_mean"], b["reward_mean"])
    pd.testing.assert_frame_equal(a[["loss", "grad_norm", "step_scale", "kl_real"]],
                                  b[["loss", "grad_norm", "step_scale", "kl_real"]],
                                  rtol=1e-3, atol=1e-6)
    assert (a["sync_bytes"] == b["sync_bytes"]).all()  # the same payloads, gathered
    assert b["sync_drift"].dropna().max() < 1e-6  # rank 0's engine followed the payloads
    base, w1, w2 = load(tiny_dir)[0].state_dict(), weights(tmp_path / "single"), \
        weights(tmp_path / "fsdp")
    assert w1.keys() == w2.keys()
    moved = max((w1[n] - base[n]).abs().max().item() for n in w1)
    assert moved > 1e-3  # the runs trained
    worst = max((w1[n] - w2[n]).abs().max().item() for n in w1) / moved
    assert worst < TOLERANCE, worst

    if method == "galore":  # its state has its own layout (tests/baselines/test_galore.py)
        return
    model = load(tiny_dir)[0]
    if method == "logra":  # its state (A, r x in, and v, out, per target) is whole on every rank
        targets = [p for n, p in model.named_parameters() if n.endswith("proj.weight")]
        assert sharded["optimizer_state_bytes"] == single["optimizer_state_bytes"] == 4 * sum(
            2 * p.shape[1] + p.shape[0] for p in targets)
        return
    # per-rank optimizer state: dense Adam's moments are halved (rank 0 holds ceil(rows / 2) of
    # each, the vocabulary has 99 rows); Sketch-Adam's moments too, its bases (n x r per
    # sketched weight) are replicated
    sketched = {n: p for n, p in model.named_parameters()
                if n.endswith("proj.weight")} if method == "sketch_adam" else {}
    dense = [p for n, p in model.named_parameters() if n not in sketched]
    rows = {p: (p.shape[0], p[0].numel()) for p in dense}  # (rows, elements per row)
    r = 2
    single_bytes = 4 * (2 * sum(p.numel() for p in dense)
                        + sum(p.shape[1] * r + 2 * p.shape[0] * r for p in sketched.values()))
    rank0_bytes = 4 * (2 * sum(math.ceil(n / 2) * k for n, k in rows.values())
                       + sum(p.shape[1] * r + 2 * math.ceil(p.shape[0] / 2) * r
                             for p in sketched.values()))
    assert single["optimizer_state_bytes"] == single_bytes
    assert sharded["optimizer_state_bytes"] == rank0_bytes
    ratio = sharded["optimizer_state_bytes"] / single["optimizer_state_bytes"]
    assert ratio < (0.51 if method == "dense_adam" else 0.6), ratio


GALORE_COMMS = """
import torch
from torch.distributed.tensor.debug import CommDebugMode
from baselines.galore import GaLore
from logra.optim import collectives
from logra.rl import fsdp
from logra.rl.models import load
mesh, _ = fsdp.init(torch.device("cpu"))
model = load(BASE)[0]
fsdp.shard(model, mesh, torch.float32)
rule = GaLore(model, lr=1e-3, rank=2, update_proj_gap=2)
ids = torch.randint(3, 90, (4, 10), generator=torch.Generator().manual_seed(0))
for step in range(3):
    model(input_ids=ids).logits.sum().backward()
    with CommDebugMode() as comms:
        rule.propose()
    rule.apply(None)
    gathers = sum(n for op, n in comms.get_comm_counts().items() if "all_gather" in str(op))
    if collectives.rank() == 0:
        print(step, gathers)
"""


def test_galore_under_fsdp_gathers_whole_gradients_at_refresh(tmp_path, tiny_dir):
    """What galore-torch does under FSDP, recorded: at a projection refresh (updates 1 and 3
    with update_proj_gap 2) its SVD makes DTensor all-gather each projected weight's whole
    gradient (one all-gather per weight); between refreshes, none."""
    script = tmp_path / "galore_comms.py"
    script.write_text(GALORE_COMMS.replace("BASE", repr(str(tiny_dir))))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", str(script)], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    projected = 2 * 7  # two layers x (q, k, v, o, gate, up, down)
    assert proc.stdout.split() == ["0", str(projected), "1", "0", "2", str(projected)]


def test_sharded_sketch_adam_refuses_what_cannot_stay_local():
    """A left basis or an SVD basis needs whole gradients: refused when the rule is built."""
    code = ("import torch, torch.distributed as dist\n"
            "from torch.distributed.device_mesh import init_device_mesh\n"
            "from transformers import AutoModelForCausalLM\n"
            "from logra.rl import fsdp\nfrom baselines.sketch_adam import SketchAdam\n"
            "from logra.rl.models import tiny_config\n"
            "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:29533', rank=0, "
            "world_size=1)\n"
            "m = AutoModelForCausalLM.from_config(tiny_config(hidden_size=32, "
            "intermediate_size=64, num_hidden_layers=1, num_attention_heads=2))\n"
            "fsdp.shard(m, init_device_mesh('cpu', (1,)), torch.float32)\n"
            "for opts in ({'side': 'left'}, {'basis': 'svd'}):\n"
            "    try:\n        SketchAdam(m, rank=2, **opts)\n"
            "    except ValueError as e:\n        print(e)\n"
            "dist.destroy_process_group()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all("model.layers.0.self_attn.q_proj.weight is sharded (FSDP)"
                                   in line for line in lines), proc.stdout
    assert "side='left'" in lines[0] and "basis='svd'" in lines[1]


def test_bf16_compute_keeps_float32_weights(tmp_path, tiny_dir):
    """grpo.compute_dtype bfloat16 (autocast in one process): forwards in bf16, the trained and
    saved weights float32, and the run's numbers close to the float32 run's."""
    cfg, train_jsonl = make_run(tmp_path, "dense_adam")
    fp32 = train(cfg, tiny_dir, train_jsonl, tmp_path / "fp32")
    cfg["grpo"]["compute_dtype"] = "bfloat16"
    bf16 = train(cfg, tiny_dir, train_jsonl, tmp_path / "bf16")
    assert bf16["status"] == "ok" and bf16["compute_dtype"] == "bfloat16"
    assert bf16["dtype"] == "float32"
    w32, w16 = weights(tmp_path / "fp32"), weights(tmp_path / "bf16")
    assert all(w.dtype == torch.float32 for w in w16.values())
    assert any(not torch.equal(w32[n], w16[n]) for n in w32)  # bf16 did change the numbers
    assert bf16["kl"]["median_real"] == pytest.approx(fp32["kl"]["median_real"], rel=0.2)


def test_sharded_oom_is_recorded_with_the_base_model(tmp_path, tiny_dir):
    """What workflow/scripts/train.py records when a rank of a sharded run ran out of memory
    (it raised, torchrun stopped every rank): status oom with the rank's numbers, the base
    model as the run's model, an empty metrics table."""
    from logra.rl.summary import METRIC_COLUMNS, oom_result
    cfg, _ = make_run(tmp_path, "dense_adam")
    cfg["grpo"]["nproc_per_node"] = 2
    oom = {"oom_at_step": 3, "oom_needed_bytes": 123, "oom_check": "CUDA allocator capped"}
    summary = oom_result(cfg, tiny_dir, tmp_path / "run", oom)
    assert summary["status"] == "oom" and summary["oom_needed_bytes"] == 123
    assert summary["model_step"] == 0 and summary["nproc_per_node"] == 2
    assert list(pd.read_csv(tmp_path / "run/metrics.csv").columns) == METRIC_COLUMNS
    base = load(tiny_dir)[0].state_dict()
    assert all(torch.equal(base[n], w) for n, w in weights(tmp_path / "run").items())


LOGRA_SKETCH = """
import torch
from logra.optim import collectives
from logra.rl import fsdp
from logra.optim.logra_rule import LoGRA
from logra.rl.models import load
mesh, _ = fsdp.init(torch.device("cpu"))
rank, world = collectives.rank(), collectives.world_size()
ids = torch.randint(3, 90, (4, 10), generator=torch.Generator().manual_seed(0))

def loss_of(model, rows):  # token-summed NLL over the whole batch's token count
    out = model(input_ids=ids[rows], labels=ids[rows])
    return out.loss * (ids[rows].shape[0] * 9) / (ids.shape[0] * 9)

plain = load(BASE)[0]  # one process, every sequence: dense gradients
loss_of(plain, slice(0, 4)).backward()
model = load(BASE)[0]
fsdp.shard(model, mesh, torch.float32)
rule = LoGRA(model, rank=2)
(loss_of(model, slice(2 * rank, 2 * rank + 2)) * world).backward()  # as the loop does
worst = 0.0
grads = dict(plain.named_parameters())
for t in rule.targets:
    s = collectives.all_reduce(t.s.clone()) / world  # what propose() forms
    want = grads[t.name + ".weight"].grad @ t.a.T
    worst = max(worst, ((s - want).abs().max() / want.abs().max()).item())
if rank == 0:
    print(worst)
"""


def test_logra_sketch_under_fsdp_is_the_dense_gradient_times_the_projection(tmp_path, tiny_dir):
    """Each rank sketches its micro-batch through the sharded model (its rows of W never
    gathered); summed over the ranks and divided by the world size (each rank's loss x world),
    S is G·Aᵀ of the whole batch's dense gradient in one process (float32: relative 1e-5)."""
    script = tmp_path / "logra_sketch.py"
    script.write_text(LOGRA_SKETCH.replace("BASE", repr(str(tiny_dir))))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node=2", str(script)], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(proc.stdout.split()[-1]) < 1e-5, proc.stdout
