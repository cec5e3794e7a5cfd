"""Reproducible CPU runs (logra/repro.py): the pin reaches every process, pinned bits repeat
across processes, and fingerprints see every bit of a result and nothing of the machine."""
import math
import subprocess
import sys

import pandas as pd
import pytest
import torch
from conftest import ROOT

from logra import repro
from logra.harness import fingerprints

AVX2 = "avx2" in repro.machine()["cpu_flags"]

@pytest.mark.e2e  # two fresh processes, each loading torch on the pinned path
@pytest.mark.skipif(not AVX2, reason="this CPU has no AVX2: the pinned path is not available")
def test_pinned_updates_repeat_bit_for_bit_in_two_processes():
    code = ("import torch; from logra.harness.fingerprints import canary; "
            "print(torch.backends.cpu.get_cpu_capability(), canary())")
    first, second = (subprocess.run([sys.executable, "-c", code], capture_output=True,
                                    text=True, cwd=ROOT, timeout=300) for _ in range(2))
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.split()[0] == "AVX2"  # the pin reached the fresh process
    assert first.stdout == second.stdout


def test_tensors_digest_sees_one_bit_and_names():
    state = {"a": torch.randn(3, 4), "b": torch.zeros(2)}
    same = {k: v.clone() for k, v in reversed(state.items())}
    assert repro.tensors_digest(state) == repro.tensors_digest(same)  # order of keys: no
    flipped = {k: v.clone() for k, v in state.items()}
    flipped["a"].view(torch.int32)[1, 2] ^= 1  # the last mantissa bit of one element
    assert repro.tensors_digest(flipped) != repro.tensors_digest(state)
    assert repro.tensors_digest({"c": state["a"], "b": state["b"]}) != repro.tensors_digest(state)
    assert (repro.tensors_digest({"a": state["a"].reshape(4, 3), "b": state["b"]})
            != repro.tensors_digest(state))  # shape
    assert (repro.tensors_digest({"a": state["a"].double(), "b": state["b"]})
            != repro.tensors_digest(state))  # dtype


def test_metrics_digest_ignores_the_machine_not_the_results():
    rows = [{"step": 1, "loss": 0.25, "step_time_s": 0.5, "peak_mem_bytes": 100,
             "sync_drift": math.nan, "sync_seconds": 0.01}]
    slower = [dict(rows[0], step_time_s=9.0, peak_mem_bytes=math.nan, sync_seconds=0.5)]
    assert repro.metrics_digest(rows) == repro.metrics_digest(slower)
    one_ulp = [dict(rows[0], loss=math.nextafter(0.25, 1))]
    assert repro.metrics_digest(one_ulp) != repro.metrics_digest(rows)


def test_first_difference_names_the_earliest_stage():
    cols = ["stage", "name", "what", "sha256"]
    ref = pd.DataFrame([("data", "d", "file", "1"), ("base", "b", "weights", "2"),
                        ("train", "t", "weights", "3"), ("eval", "e", "result", "4")],
                       columns=cols)
    assert fingerprints.first_difference(ref.copy(), ref) is None
    fresh = ref.copy()
    fresh.loc[3, "sha256"], fresh.loc[2, "sha256"] = "x", "y"  # train and eval differ
    assert (fingerprints.first_difference(fresh, ref)
            == "stage 'train' differs first: t weights: other bits")
    missing = ref[ref["stage"] != "base"]
    assert "b weights: missing" in fingerprints.first_difference(missing, ref)
    extra = pd.concat([ref, pd.DataFrame([("data", "d2", "file", "5")], columns=cols)])
    assert "d2 file: not in the reference" in fingerprints.first_difference(extra, ref)
    # a reference without a kind's rows checks the others, and says which it does not
    no_eval = ref[ref["stage"] != "eval"]
    eval_only = ref.copy()
    eval_only.loc[3, "sha256"] = "x"
    assert fingerprints.first_difference(eval_only, no_eval) is None
    assert fingerprints.unchecked(no_eval) == ["train metrics", "eval result"]
    assert fingerprints.first_difference(fresh, no_eval).startswith("stage 'train'")
    # within a stage: without the train metrics, the train weights are still checked
    full = pd.concat([ref, pd.DataFrame([("train", "t", "metrics", "6")], columns=cols)])
    assert fingerprints.unchecked(full) == []
    no_metrics = full[full["what"] != "metrics"]
    new_metrics = full.copy()
    new_metrics.loc[new_metrics["what"] == "metrics", "sha256"] = "z"
    assert fingerprints.first_difference(new_metrics, no_metrics) is None
    assert fingerprints.first_difference(new_metrics, full) == (
        "stage 'train' differs first: t metrics: other bits")
    assert fingerprints.first_difference(fresh, no_metrics).startswith("stage 'train'")


def test_covered_only_where_bits_are_promised():
    intel = {"reproducible": True, "cpu_vendor": "GenuineIntel", "cpu_model": "Xeon",
             "cpu_flags": ["avx2", "avx512f"]}
    assert repro.covered(intel) is None
    assert "Intel processors only" in repro.covered(intel | {"cpu_vendor": "AuthenticAMD"})
    assert "no AVX2" in repro.covered(intel | {"cpu_flags": ["avx"]})
    assert "pin is not set" in repro.covered(intel | {"reproducible": False})


def test_this_process_and_its_children_are_pinned():
    info = repro.machine()
    assert info["reproducible"] and info["pinned"] == repro.PIN
    if AVX2:
        assert info["torch_capability"] == "AVX2"


def test_model_digest_reads_a_checkpoint_tensor_by_tensor(tiny_dir):
    from safetensors.torch import load_file
    state = {}
    for f in sorted(tiny_dir.glob("*.safetensors")):
        state.update(load_file(f))
    assert repro.model_digest(tiny_dir) == repro.tensors_digest(state)
