"""Run trackers: a GRPO run's scalars per step (metrics.csv's columns), its evaluations' scores
at the step they belong to, and its resolved config as text, in TensorBoard by default and in
W&B on request (config `tracking`, docs/running.md, "Watching runs").

`Trackers(tracking, run_dir, name, group)` opens the configured backends, each with `log(step,
scalars)`, `text(tag, text)` and `close()`. A backend that raises is named once on stderr and
left out from then on: a run never stops or changes for its tracker, and metrics.csv stays the
record.

- TensorBoard (`tracking.tensorboard`, on by default): event files in the run's folder, `tb/`,
  written with `torch.utils.tensorboard`; `tensorboard --logdir results/runs` lists every run as
  task/method/seedN/tb. A run that resumes at step s opens its writer with `purge_step` s, so
  TensorBoard drops what the interrupted process logged from s on.
- W&B (`tracking.wandb: {project, mode, entity}`, off by default): one W&B run per GRPO run, its
  id kept in the run's folder (`wandb_id`) so that the run's evaluations log to the same run;
  `mode: offline` unless told (`wandb sync` uploads later); its files go under the run's
  `wandb/`.

Values that are not finite numbers (a step without a memory profile) are not logged.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path


class TensorBoard:
    def __init__(self, run_dir: Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(str(run_dir / "tb"), purge_step=purge_step)

    def log(self, step: int, scalars: dict) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # a run watched live, or killed, shows every step it made

    def text(self, tag: str, text: str) -> None:
        self.writer.add_text(tag, text)

    def close(self) -> None:
        self.writer.close()


class WandB:
    def __init__(self, run_dir: Path, name: str, group: str, project: str,
                 mode: str = "offline", entity: str | None = None):
        import secrets

        import wandb
        id_file = run_dir / "wandb_id"
        if not id_file.exists():
            run_dir.mkdir(parents=True, exist_ok=True)
            id_file.write_text(secrets.token_hex(4))  # W&B's own ids are 8 characters too
        self.run = wandb.init(project=project, entity=entity, mode=mode, name=name,
                              group=group, id=id_file.read_text().strip(), resume="allow",
                              dir=str(run_dir), settings=wandb.Settings(silent=True))

    def log(self, step: int, scalars: dict) -> None:
        self.run.log(scalars, step=step)

    def text(self, tag: str, text: str) -> None:
        self.run.config.update({tag: text}, allow_val_change=True)

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The backends `tracking` asks for (config `tracking`), for the run whose folder is
    `run_dir`; `purge_step`: the first step this process logs, for a resumed run."""

    def __init__(self, tracking: dict | None, run_dir: str | Path, name: str, group: str,
                 purge_step: int | None = None):
        tracking, run_dir = tracking or {}, Path(run_dir)
        self.backends = []
        opens = []
        if tracking.get("tensorboard"):
            opens.append(("tensorboard", lambda: TensorBoard(run_dir, purge_step)))
        if tracking.get("wandb"):
            opens.append(("wandb", lambda: WandB(run_dir, name, group, **tracking["wandb"])))
        for what, open_ in opens:
            try:
                self.backends.append(open_())
            except Exception as e:  # noqa: BLE001 - named, and the run goes on
                self._drop(what, e)

    def _drop(self, backend, error: Exception) -> None:
        name = backend if isinstance(backend, str) else type(backend).__name__
        print(f"tracking: {name} left out of this run after {type(error).__name__}: {error} "
              "(metrics.csv keeps every step)", file=sys.stderr)
        if not isinstance(backend, str):
            self.backends.remove(backend)

    def _each(self, method: str, *args) -> None:
        for backend in list(self.backends):
            try:
                getattr(backend, method)(*args)
            except Exception as e:  # noqa: BLE001 - named, and the run goes on
                self._drop(backend, e)

    def log(self, step: int, scalars: dict) -> None:
        """The finite numbers of `scalars` at `step`."""
        numbers = {k: float(v) for k, v in scalars.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v)}
        if numbers:
            self._each("log", step, numbers)

    def text(self, tag: str, text: str) -> None:
        self._each("text", tag, text)

    def close(self) -> None:
        self._each("close")
        self.backends = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def evaluated_run(model_dir: str | Path) -> tuple[Path, int] | None:
    """(the run's folder, the step) of a checkpoint an evaluation scores: a run's saved model
    (`<run>/model`, at its summary's `model_step`) or a snapshot (`<run>/snapshots/step<N>`);
    None for anything else (an SFT base)."""
    model_dir = Path(model_dir)
    if model_dir.parent.name == "snapshots" and model_dir.name.startswith("step"):
        return model_dir.parent.parent, int(model_dir.name.removeprefix("step"))
    summary = model_dir.parent / "summary.json"
    if model_dir.name == "model" and summary.exists():
        import json
        step = json.loads(summary.read_text()).get("model_step")
        return (model_dir.parent, int(step)) if step is not None else None
    return None


def log_evaluation(tracking: dict | None, model_dir: str | Path, metrics: dict) -> None:
    """An evaluation's `metrics` (logra.harness.evaluate's: per protocol its accuracy and
    pass@k) as `eval/<protocol>/<score>` at the step of the run checkpoint `model_dir`
    (`evaluated_run`), in that run's trackers; nothing for a checkpoint of no run."""
    found = evaluated_run(model_dir)
    if found:
        run_dir, step = found
        task, method, seed = run_dir.parts[-3:]  # results/runs/<task>/<method>/seed<N>
        with Trackers(tracking, run_dir, f"{task}/{method}/{seed}", f"{task}/{method}") as t:
            t.log(step, {f"eval/{protocol}/{score}": m[score] for protocol, m in metrics.items()
                         for score in ("accuracy", "pass_at_k")})


def tensorboard_scalars(run_dir: str | Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of the run's TensorBoard events (`<run_dir>/tb`), as TensorBoard
    shows them: what a resumed run purged left out, a step logged twice at its last value."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(Path(run_dir) / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)}
            for tag in events.Tags()["scalars"]}
