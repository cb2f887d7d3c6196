"""Options the ``vitlab`` command reads itself, for every sub-command: ``--seed``, and the words left after a
command's own arguments (config overrides, or a stray argument that is none).

Examples::

    vitlab --seed 3 fit --config vit/digits        # = vitlab fit --config vit/digits run.seed=3
"""

from __future__ import annotations


def seed_overrides(seed: int | None, rest: list[str]) -> list[str]:
    """``--seed N`` (before or after the command) as the override ``run.seed=N``; ``rest`` without it."""
    out, i = [], 0
    while i < len(rest):
        arg = rest[i]
        if arg == "--seed" and i + 1 < len(rest):
            seed, i = int(rest[i + 1]), i + 2
            continue
        if arg.startswith("--seed="):
            seed = int(arg.split("=", 1)[1])
        else:
            out.append(arg)
        i += 1
    return out if seed is None else [*out, f"run.seed={seed}"]


def stray_arguments(rest: list[str]) -> list[str]:
    """The words of ``rest`` (what a command's parser left) that are neither an option nor a config override
    (``key.sub=value``, ``--key.sub value``): a second run directory, an image after the options."""
    strays, i = [], 0
    while i < len(rest):
        arg = rest[i]
        if arg.startswith("-") and "=" not in arg:
            i += 2  # --key.sub value
            continue
        if not arg.startswith("-") and "=" not in arg:
            strays.append(arg)
        i += 1
    return strays
