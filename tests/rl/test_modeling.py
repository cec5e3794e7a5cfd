"""Tiny models and the character tokenizer: round trip, loading, clear errors."""
import shutil

import pytest
from conftest import ROOT
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from logra.rl.models import build_tiny, char_tokenizer, load, n_params
from logra.rl.tiny import CHARSET, SPECIAL_TOKENS

TOK = char_tokenizer()


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=CHARSET, max_size=200))
def test_tokenizer_round_trip(text):
    # a literal "<eos>" in the text is the special token, as in every HF tokenizer (below)
    assume(not any(s in text for s in SPECIAL_TOKENS))
    ids = TOK(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert TOK.decode(ids) == text


def test_special_token_strings_in_text_are_special_tokens():
    assert TOK("1<eos>")["input_ids"] == [TOK("1")["input_ids"][0], TOK.eos_token_id]


def test_unknown_characters_become_unk_and_eos_is_special():
    ids = TOK("a\u00e9b")["input_ids"]
    assert ids[1] == TOK.unk_token_id
    assert TOK.decode(ids + [TOK.eos_token_id], skip_special_tokens=True) == "ab"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_saved_model_and_tokenizer_load_back(tmp_path, arch):
    d = build_tiny(tmp_path / arch, architecture=arch, hidden_size=32, intermediate_size=64,
                   num_hidden_layers=1, num_attention_heads=2)
    model, tok = load(d)
    assert model.config.model_type == arch
    assert tok("Q: 12+34\nA: ")["input_ids"] == TOK("Q: 12+34\nA: ")["input_ids"]
    assert n_params(model) == sum(p.numel() for p in model.parameters())


def test_load_errors_name_the_problem(tmp_path, tiny_dir):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load(tmp_path)
    no_tok = tmp_path / "no_tok"
    shutil.copytree(tiny_dir, no_tok)
    (no_tok / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="has no tokenizer"):
        load(no_tok)
    with pytest.raises(ValueError, match="hidden_size=30 is not divisible"):
        build_tiny(tmp_path / "bad", hidden_size=30, num_attention_heads=4)


def test_context_is_sized_from_the_data_and_a_short_model_is_named_with_its_task():
    """The positions a task needs hold its longest prompt + target + eos, plus the room to
    generate; a model holding fewer stops with the task and the model named."""
    from logra.rl.models import char_tokenizer, check_context, context_needed, tiny_config
    from logra.rl.tasks import get_task

    task = get_task("arithmetic", digits=3)
    examples = task.splits(0, 20, 5)["train"]
    needed = context_needed(char_tokenizer(), task, examples, room=16)
    longest = max(len(task.prompt(e) + task.target(e)) for e in examples)  # one token a char
    assert needed == longest + 1 + 16
    check_context(tiny_config(max_position_embeddings=needed), needed, "sums", "tiny")
    with pytest.raises(ValueError, match=r"tasks\.sums: .* needs 40 positions; model org/m "
                                         r"holds max_position_embeddings=39"):
        check_context(tiny_config(max_position_embeddings=39), 40, "sums", "org/m")


def test_a_jobs_imports_load_transformers_models_without_its_extras(tmp_path):
    """A GRPO run's, a memory point's and an evaluation's imports (lm-eval's HF model after
    logra.rl.models, as logra.harness.evaluate orders them), and a model's load, bring in none
    of scikit-learn, scipy and torchao (about 2 s of every job's start-up); each still imports
    afterwards, and torchao's 8-bit AdamW steps."""
    import subprocess
    import sys
    code = ("import sys\nimport logra.rl.loop, logra.harness.memory_point\n"
            "from lm_eval.models.huggingface import HFLM\n"
            "from logra.rl.models import build_tiny, load\n"
            "load(build_tiny(sys.argv[1], hidden_size=8, intermediate_size=8,\n"
            "                num_hidden_layers=1, num_attention_heads=2))\n"
            "assert 'transformers.generation.candidate_generator' in sys.modules\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in\n"
            "             ('sklearn', 'scipy', 'torchao')))\n"
            "import sklearn.metrics, scipy.optimize, torch\n"
            "from torchao.optim import AdamW8bit\n"
            "w = torch.nn.Parameter(torch.ones(256, 256))\n"
            "opt = AdamW8bit([w], lr=0.1)\n"
            "w.sum().backward()\n"
            "opt.step()\n"
            "assert (w < 1).all()\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


def test_the_workflows_config_check_imports_no_more_than_it_needs():
    """Snakemake's main process checks the config in full (each rule built on a meta model):
    it loads transformers' model code as the jobs do, without scikit-learn, scipy and torchao;
    a job that re-reads the Snakefile in a process of its own (a slurm job) checks it without
    building the rules, and loads no transformers at all (about 2 s of each such job)."""
    import subprocess
    import sys
    code = ("import sys\nfrom logra.harness.config import resolve\n"
            "resolve(['tests/data/smoke.yaml'], fit_rules=sys.argv[1] == 'main')\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} &\n"
            "             {'transformers', 'sklearn', 'scipy', 'torchao'}))\n")
    loaded = {}
    for process in ("main", "job"):
        out = subprocess.run([sys.executable, "-c", code, process], capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
        assert out.returncode == 0, out.stderr[-3000:]
        loaded[process] = out.stdout.strip()
    assert loaded == {"main": "['transformers']", "job": "[]"}
