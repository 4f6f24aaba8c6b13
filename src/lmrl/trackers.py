"""Experiment trackers fed alongside the run directory's metrics.jsonl: TensorBoard, W&B, MLflow.

`run.trackers: [tensorboard, wandb, mlflow]` picks them (docs/trackers.md). Each lives behind its own
optional dependency, imported only when chosen; `check_trackers` finds a missing package with
`importlib.util.find_spec` before anything heavy loads and names the extra to install. The loop talks
to one `Trackers`, which fans every call out to the chosen trackers:

    trackers = Trackers.from_config(cfg.run.trackers, run_dir, cfg.model_dump(mode="json"))
    trackers.log(step, metrics)          # None / NaN / inf / non-numeric values are skipped
    trackers.log_samples(step, rows)     # rows of prompt, completion, reward, gold, ...
    trackers.close()

A tracker that fails while logging (a full disk, a lost connection) is reported once on stderr and
dropped, so it cannot end a training run; one that fails to start raises.
"""
from __future__ import annotations

import importlib.util
import json
import math
import netrc
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lmrl.config import ConfigError
from lmrl.registry import Registry


@runtime_checkable
class Tracker(Protocol):
    """One experiment tracker. `start` comes first and `close` last; `log*` in between, steps non-decreasing."""

    def start(self, run_dir: Path, config: dict[str, Any]) -> None: ...

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


TRACKERS: Registry[type] = Registry("tracker")

SAMPLE_COLUMNS = ("step", "split", "prompt", "completion", "reward", "gold")  # first, in this order


def clean_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numeric values of `metrics` as floats; None, NaN, inf and non-numbers are left out."""
    out = {}
    for key, value in metrics.items():
        if value is None or isinstance(value, (str, bytes)):
            continue
        try:
            number = float(value)  # ints, bools, numpy and 0-d torch scalars
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            out[str(key)] = number
    return out


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def sample_table(step: int, rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Columns (step, split, prompt, completion, reward, gold, then any others in order seen) and cells.

    Cells are None, bool, int, finite float or str (lists and dicts as JSON), so every tracker can store them.
    """
    rows = [{"step": step, **row} for row in rows]
    seen = {k: None for row in rows for k in row}
    columns = [c for c in SAMPLE_COLUMNS if c in seen] + [c for c in seen if c not in SAMPLE_COLUMNS]
    return columns, [[_cell(row.get(c)) for c in columns] for row in rows]


def _missing(modules: tuple[str, ...]) -> list[str]:
    out = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package that is missing or broken
            found = False
        if not found:
            out.append(module)
    return out


def check_trackers(names: list[str]) -> None:
    """Every name registered, none twice, and its packages importable (found, not imported)."""
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"run.trackers: {TRACKERS.unknown_message(name)}")
        if names.count(name) > 1:
            raise ConfigError(f"run.trackers: {name!r} is listed twice")
        cls = TRACKERS.get(name)
        missing = _missing(cls.required_modules())
        if missing:
            raise ConfigError(f"run.trackers: {name} needs the Python package(s) {missing}, which are not installed; "
                              f"run `pip install 'lmrl[{name}]'` (or `pip install {' '.join(cls.pip_packages)}`)")


def _warn(message: str) -> None:
    print(f"lmrl trackers: {message}", file=sys.stderr, flush=True)


class Trackers:
    """The chosen trackers behind one interface; with none chosen every call does nothing."""

    def __init__(self, trackers: dict[str, Tracker] | None = None):
        self.trackers: dict[str, Tracker] = dict(trackers or {})

    @classmethod
    def from_config(cls, names: list[str], run_dir: Path, config: dict[str, Any]) -> "Trackers":
        """Check `names` (run.trackers), then create and start each on `run_dir` with the resolved config."""
        names = list(names or [])
        check_trackers(names)
        if hasattr(config, "model_dump"):  # a Config passed as it is
            config = config.model_dump(mode="json")
        config = json.loads(json.dumps(config or {}, default=str))  # plain JSON values for every tracker
        run_dir = Path(run_dir)
        if names:
            run_dir.mkdir(parents=True, exist_ok=True)
        started: dict[str, Tracker] = {}
        try:
            for name in names:
                tracker = TRACKERS.get(name)()
                tracker.start(run_dir, config)
                started[name] = tracker
        except BaseException:
            Trackers(started).close()
            raise
        return cls(started)

    @property
    def names(self) -> list[str]:
        return list(self.trackers)

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def _each(self, method: str, *args: Any) -> None:
        for name, tracker in list(self.trackers.items()):
            try:
                getattr(tracker, method)(*args)
            except Exception as err:  # noqa: BLE001 - a tracker must not end the training run
                _warn(f"{name}.{method} failed ({type(err).__name__}: {err}); {name} is turned off for this run")
                self.trackers.pop(name, None)
                try:
                    tracker.close()
                except Exception:  # noqa: BLE001
                    pass

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        values = clean_metrics(metrics)
        if values:
            self._each("log", int(step), values)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._each("log_samples", int(step), [dict(r) for r in rows])

    def close(self) -> None:
        """Close every tracker (each once; errors are reported, not raised)."""
        trackers, self.trackers = self.trackers, {}
        for name, tracker in trackers.items():
            try:
                tracker.close()
            except Exception as err:  # noqa: BLE001
                _warn(f"{name}.close failed ({type(err).__name__}: {err})")

    def __enter__(self) -> "Trackers":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Base:
    modules: tuple[str, ...] = ()
    pip_packages: tuple[str, ...] = ()

    @classmethod
    def required_modules(cls) -> tuple[str, ...]:
        return cls.modules


def _markdown_table(columns: list[str], data: list[list[Any]]) -> str:
    def esc(value: Any) -> str:
        text = "" if value is None else str(value)
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(esc(v) for v in row) + " |" for row in data])


@TRACKERS.register("tensorboard", "TensorBoard event files in <run>/tensorboard: scalars, the config and sample tables")
class TensorBoardTracker(_Base):
    modules = ("tensorboard", "torch.utils.tensorboard")
    pip_packages = ("tensorboard",)

    def start(self, run_dir: Path, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = run_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        text = json.dumps(config, indent=2, default=str)
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)  # indented: a code block
        self.writer.flush()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.writer.add_text("samples", _markdown_table(*sample_table(step, rows)), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _wandb_key_present() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = re.sub(r"^https?://", "", os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).split("/")[0]
    try:
        return netrc.netrc().authenticators(host) is not None  # where `wandb login` stores the key
    except (OSError, netrc.NetrcParseError):
        return False


@TRACKERS.register("wandb", "Weights & Biases: online with an API key, else offline under <run>/wandb (wandb sync)")
class WandbTracker(_Base):
    """`WANDB_MODE` wins when set; otherwise online when an API key is found (WANDB_API_KEY or `wandb
    login`), else offline. Project `WANDB_PROJECT` (default lmrl), run name the run directory's name;
    a resumed run continues the same W&B run (its id is kept in <run>/wandb/lmrl_run_id)."""

    modules = ("wandb",)
    pip_packages = ("wandb",)

    def start(self, run_dir: Path, config: dict[str, Any]) -> None:
        import wandb

        wandb_dir = run_dir / "wandb"
        wandb_dir.mkdir(parents=True, exist_ok=True)
        id_file = wandb_dir / "lmrl_run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        mode = os.environ.get("WANDB_MODE") or ("online" if _wandb_key_present() else "offline")
        if mode == "offline" and not os.environ.get("WANDB_MODE"):
            _warn(f"wandb: no API key found, logging offline under {wandb_dir}; upload later with "
                  f"`wandb sync {wandb_dir}/offline-run-*` (or set WANDB_API_KEY / run `wandb login`)")
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "lmrl", name=run_dir.name, id=run_id,
                              resume="allow", dir=str(run_dir), config=config, mode=mode, reinit="create_new")
        id_file.write_text(run_id)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        import wandb

        columns, data = sample_table(step, rows)
        self.run.log({"samples": wandb.Table(columns=columns, data=data)}, step=step)

    def close(self) -> None:
        self.run.finish()


MLFLOW_KEY = re.compile(r"[^\w\-. /]")  # characters MLflow refuses in metric and param names


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@TRACKERS.register("mlflow", "MLflow: a local SQLite store under <run>/mlflow (or MLFLOW_TRACKING_URI): "
                             "metrics, params, config and sample tables as artifacts")
class MlflowTracker(_Base):
    """Without `MLFLOW_TRACKING_URI`, a SQLite store `<run>/mlflow/mlflow.db` with artifacts in
    `<run>/mlflow/artifacts` (MLflow 3 refuses the old `file:` store unless MLFLOW_ALLOW_FILE_STORE=true;
    SQLite is its local default). Experiment `MLFLOW_EXPERIMENT_NAME` (default lmrl), run name the run
    directory's name; a resumed run continues the same MLflow run (id kept in <run>/mlflow/lmrl_run_id)."""

    modules = ("mlflow",)
    pip_packages = ("mlflow-skinny", "sqlalchemy", "alembic")

    @classmethod
    def required_modules(cls) -> tuple[str, ...]:
        local = not os.environ.get("MLFLOW_TRACKING_URI")
        return cls.modules + (("sqlalchemy", "alembic") if local else ())

    def start(self, run_dir: Path, config: dict[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        root = run_dir / "mlflow"
        root.mkdir(parents=True, exist_ok=True)
        self._sample_calls: dict[int, int] = {}
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        self.client = MlflowClient(tracking_uri=uri or f"sqlite:///{root.resolve() / 'mlflow.db'}")
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "lmrl"
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            location = None if uri else (root.resolve() / "artifacts").as_uri()
            experiment_id = self.client.create_experiment(name, artifact_location=location)
        id_file = root / "lmrl_run_id"
        previous = id_file.read_text().strip() if id_file.is_file() else None
        if previous and self._exists(previous):
            self.run_id = previous
            self.client.update_run(previous, status="RUNNING")
            return
        self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        id_file.write_text(self.run_id)
        from mlflow.entities import Param

        params = [Param(MLFLOW_KEY.sub("_", k)[:250], json.dumps(v) if not isinstance(v, str) else v)
                  for k, v in _flatten(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=[Param(p.key, p.value[:6000]) for p in params[i:i + 100]])
        self.client.log_dict(self.run_id, config, "config.json")

    def _exists(self, run_id: str) -> bool:
        try:
            self.client.get_run(run_id)
            return True
        except Exception:  # noqa: BLE001 - MlflowException when the store does not have it
            return False

    def log(self, step: int, metrics: dict[str, float]) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [Metric(MLFLOW_KEY.sub("_", k), v, now, step) for k, v in metrics.items()]
        for i in range(0, len(entries), 1000):
            self.client.log_batch(self.run_id, metrics=entries[i:i + 1000])

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        # one table per call, in log_table's {"columns", "data"} layout; not log_table itself, whose
        # appending re-reads the table with pandas and turns gold answers like "4" into numbers
        columns, data = sample_table(step, rows)
        calls = self._sample_calls[step] = self._sample_calls.get(step, 0) + 1
        name = f"samples/step_{step:06d}" + (f"_{calls}" if calls > 1 else "") + ".json"
        self.client.log_dict(self.run_id, {"columns": columns, "data": data}, name)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
