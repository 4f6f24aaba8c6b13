"""docs/migration.md: every lmrl key of its tables exists, and every `key=value` loads as an override."""
import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from lmrl.config import Config
from lmrl.loading import load_config
from lmrl.recipe_files import parse_override

DOC = Path(__file__).resolve().parents[2] / "docs" / "migration.md"


def lmrl_cells() -> list[list[str]]:
    """The backticked entries of each second-column cell of the page's tables (the rows below the headers)."""
    cells = []
    for line in DOC.read_text().splitlines():
        columns = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(columns) < 3 or columns[1] == "lmrl" or set(columns[1]) <= {"-", " ", "—"}:
            continue
        cells.append(re.findall(r"`([^`]+)`", columns[1]))
    return cells


def lmrl_column() -> list[str]:
    return [entry for cell in lmrl_cells() for entry in cell]


def section_model(annotation):
    """The pydantic section a field holds (unwrapping `X | None`), or None for a plain value."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def key_exists(key: str) -> bool:
    model = Config
    parts = key.split(".")
    for i, part in enumerate(parts):
        if model is None or part not in model.model_fields:
            return False
        if i < len(parts) - 1:
            model = section_model(model.model_fields[part].annotation)
    return True


def test_the_page_has_both_tables_full():
    entries = lmrl_column()
    assert len(entries) > 80  # both tables, every row read
    assert "trainer.lr" in entries and "algo.kl_estimator=k3" in entries and "rollout.group_size" in entries


@pytest.mark.parametrize("cell", sorted({tuple(c) for c in lmrl_cells()}), ids=" ".join)
def test_each_lmrl_key_exists_and_each_setting_loads(cell):
    for entry in cell:
        key = entry.partition("=")[0]
        assert key_exists(key), f"docs/migration.md names {key!r}, which is not a config key"
    settings = [entry for entry in cell if "=" in entry]
    if settings:  # a cell's settings together, through every config check, as `lmrl train --dry-run` runs them
        cfg = load_config("quickstart", settings)
        for entry in settings:
            key, value = parse_override(entry)
            node = cfg
            for part in key.split("."):
                node = getattr(node, part)
            assert node == value, (entry, node)


def test_a_wrong_key_is_caught():
    assert not key_exists("trainer.learning_rate") and not key_exists("model.lora.rank")
    assert key_exists("model.lora.r") and key_exists("rollout.vllm.gpu_memory_utilization")
