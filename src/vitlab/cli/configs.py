"""``vitlab list-configs``: the packaged configs (for ``--config``) with the first sentence of their comment.

Examples::

    vitlab list-configs vitcae
"""

from __future__ import annotations

import argparse

from vitlab.cli.registry import Runner, command


@command("list-configs", "list the packaged configs (for --config) with their first comment line")
def _list_configs(p: argparse.ArgumentParser) -> Runner:
    p.add_argument("pattern", nargs="?", default="*", help="glob on the name, e.g. 'vit/*' or '*cifar*'")

    def run(args: argparse.Namespace, overrides: list[str]) -> int:
        import fnmatch

        from vitlab.config import CONFIG_ROOT
        from vitlab.errors import ConfigError

        found = 0
        for path in sorted(CONFIG_ROOT.rglob("*.yaml")):
            name = str(path.relative_to(CONFIG_ROOT).with_suffix(""))
            if not (fnmatch.fnmatch(name, args.pattern) or fnmatch.fnmatch(name, f"*{args.pattern}*")):
                continue
            print(f"{name:32s} {config_summary(path.read_text())}")
            found += 1
        if not found:
            raise ConfigError(f"no packaged config matches {args.pattern!r}; `vitlab list-configs` lists them all")
        return 0

    return run


def config_summary(text: str) -> str:
    """The first sentence of a config file's leading comment, whole (it may run over several comment lines);
    command lines in the comment (``vitlab fit ...``) are not part of it."""
    words = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        content = line.lstrip("#").strip()
        if content.startswith("vitlab "):
            break
        words.append(content)
    joined = " ".join(words)
    depth = 0
    for i, char in enumerate(joined):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "." and depth == 0 and (i + 1 == len(joined) or joined[i + 1] == " "):
            return joined[: i + 1]
    return joined
