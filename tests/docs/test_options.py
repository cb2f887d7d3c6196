"""docs/options.md has a row for every key of the run config's sections (issue 62, item 8: a reference page of the
options), so a key added to a section without its line in the reference fails here."""

import dataclasses
import re
from pathlib import Path

import pytest

from vitlab.config import FinetuneConfig, OptimConfig, RunSection, TrainerConfig
from vitlab.config.model import VisionTransformerOptions
from vitlab.data.config import AugmentConfig, DataConfig

PAGE = Path(__file__).resolve().parents[2] / "docs" / "options.md"
SECTIONS = {
    "model": VisionTransformerOptions,
    "data": DataConfig,
    "data.augment": AugmentConfig,
    "optim": OptimConfig,
    "trainer": TrainerConfig,
    "run": RunSection,
    "finetune": FinetuneConfig,
}


def documented_keys(section: str) -> set[str]:
    """The keys in the first column of the table under the page's heading `` ## `section` `` (or its ``data.augment``
    table, introduced by a line that starts with `` `data.augment` ``)."""
    text = PAGE.read_text()
    if section == "data.augment":
        part = text[text.index("\n`data.augment`") :]
    else:
        part = text[text.index(f"\n## `{section}`\n") :]
        if section == "data":
            part = part[: part.index("\n`data.augment`")]
    part = part[: part.find("\n## ", 1) if "\n## " in part[1:] else len(part)]
    keys = set()
    for line in part.splitlines():
        if line.startswith("| `"):
            keys.update(re.findall(r"`([a-z_0-9]+)`", line.split("|")[1]))
    return keys


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_key_of_the_section_has_its_row(section):
    fields = {f.name for f in dataclasses.fields(SECTIONS[section])}
    assert sorted(fields - documented_keys(section)) == []
    assert sorted(documented_keys(section) - fields) == []
