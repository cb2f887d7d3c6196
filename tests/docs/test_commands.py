"""docs/commands.md has a section for every `vitlab` command, the built-in families' included (issue 62, item 8: a
reference page of the commands), so a command added without its line in the reference fails here."""

import re
from pathlib import Path

from vitlab.cli.main import COMMANDS, build_parser

PAGE = Path(__file__).resolve().parents[2] / "docs" / "commands.md"


def test_every_command_has_its_section():
    build_parser(None)  # imports every command module, the built-in families' too
    ours = {name for name, (setup, _) in COMMANDS.items() if setup.__module__.startswith("vitlab.")}  # no plug-in's
    documented = set(re.findall(r"^### `vitlab ([a-z-]+)`$", PAGE.read_text(), flags=re.M))
    assert sorted(ours - documented) == []
    assert sorted(documented - ours) == []
