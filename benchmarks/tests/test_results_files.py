"""The results files of benchmarks/results/: named by one scheme, each recording its environment, each named by a page
or a script.

The last test fails while a docs page still names a results file by its old path: the docs are brought to the new
names with benchmarks/RENAMES.tsv (old path, tab, new path or DELETED).
"""

import fnmatch
import json
import re
from pathlib import Path

import pytest

from benchmarks import naming

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
FILES = sorted(p for p in RESULTS.rglob("*") if p.is_file())


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_every_results_entry_is_named_what_device_date_under_its_kind():
    assert FILES
    kinds = {p.relative_to(RESULTS).parts[0] for p in FILES}
    assert kinds <= set(naming.KINDS), kinds
    for path in FILES:
        entry = path.relative_to(RESULTS).parts[1]  # a file, or the folder of a per-seed experiment
        assert naming.NAME.match(entry), f"{_relative(path)}: not <what>_<device>_<date>"


def test_a_new_results_path_follows_the_scheme():
    path = naming.results_path("micro", "freezing")
    assert path.parent == RESULTS / "micro" and naming.NAME.match(path.name)
    assert naming.device_name("AMD EPYC 9B14") == "epyc"
    assert naming.device_name("Intel(R) Xeon(R) Processor") == "xeon"
    assert naming.device_name("NVIDIA H200") == "nvidia-h200"
    assert naming.device_name(None) == "cpu"
    with pytest.raises(ValueError, match="kind"):
        naming.results_path("misc", "freezing")


@pytest.mark.parametrize("path", [p for p in FILES if p.suffix == ".json"], ids=_relative)
def test_every_json_results_file_records_its_environment(path):
    record = json.loads(path.read_text())
    environment = record.get("environment")
    if isinstance(environment, dict) and environment.get("recorded") is False:
        # written before the files recorded it: what is known, and the commit that added the file
        assert environment["note"] and re.fullmatch(r"[0-9a-f]{7,40}", environment["added_in"]["commit"])
    elif isinstance(environment, dict):  # vitlab.environment.environment()
        assert environment["command"] and environment.get("git_revision", environment.get("git"))
        assert environment["hardware"]["cpu_model"] and environment["versions"]["torch"]
    else:  # a per-run record (benchmarks/experiments/run_result.py): the run's own command, revision, CPU, torch
        assert record["command"] and record["git"]["revision"] and record["cpu"] and record["torch"]


def _naming_texts() -> str:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    scripts = [p for p in sorted((ROOT / "benchmarks").rglob("*")) if p.suffix in {".py", ".sh"}]
    return "\n".join(p.read_text() for p in pages + scripts if p.is_file())


def _patterns(text: str) -> list[str]:
    """Globs named in the text (``benchmarks/results/bench_${m}_fp32.json``, ``results/x_{a,b}.json``); a
    placeholder (``<what>_<device>_<date>``) describes a file to come, so it names none."""
    found = re.findall(r"(?:benchmarks/)?results/[\w./{},*$<>-]+", text)
    globs = []
    for token in found:
        if "<" in token:
            continue
        token = re.sub(r"\$\{?\w+\}?", "*", token.rstrip(".,"))
        alternatives = re.search(r"\{([^{}]*)\}", token)
        options = alternatives.group(1).split(",") if alternatives else [""]
        for option in options:
            glob = token.replace(alternatives.group(0), option) if alternatives else token
            globs.append(glob.removeprefix("benchmarks/"))
    return globs


def test_every_results_file_is_named_by_a_page_or_a_script():
    """A file is named when a page or script names it, its per-seed folder, or a glob that matches it."""
    text = _naming_texts()
    globs = _patterns(text)
    unnamed = []
    for path in FILES:
        relative = path.relative_to(RESULTS).as_posix()
        parts = relative.split("/")
        # the file, or any folder of its per-seed experiment (``<kind>/<entry>/r0.5/seed0.json``: ``<kind>/<entry>``)
        candidates = {"/".join(parts[:n]) for n in range(2, len(parts) + 1)}
        stem = relative.rsplit(".", 1)[0]  # an --out prefix that writes <stem>.json and <stem>.md
        if any(c in text for c in candidates) or stem in text:
            continue
        if any(fnmatch.fnmatch("results/" + relative, g) for g in globs):
            continue
        unnamed.append(_relative(path))
    assert unnamed == [], (
        f"named by no page or script (docs still on the old names? see benchmarks/RENAMES.tsv): {unnamed}"
    )


def _commands(record):
    if isinstance(record, dict):
        for key, value in record.items():
            if key == "command" and isinstance(value, list | str):
                yield value
            else:
                yield from _commands(value)
    elif isinstance(record, list):
        for value in record:
            yield from _commands(value)


@pytest.mark.parametrize("path", [p for p in FILES if p.suffix == ".json"], ids=_relative)
def test_recorded_commands_name_paths_relative_to_the_repository(path):
    """A command names the checkout's files and its neighbours (../shared, ../runs) relative to the repository root
    (benchmarks.naming.repo_relative), never one machine's absolute folders."""
    for command in _commands(json.loads(path.read_text())):
        args = command.split() if isinstance(command, str) else command
        absolute = [
            a.rpartition("=")[2]
            for a in args
            if re.match(r"^/\S*/(\.venv|benchmarks|src|configs|shared)/", a.rpartition("=")[2])
        ]
        assert absolute == [], (
            f"{_relative(path)} records absolute paths {absolute}; see benchmarks.naming.repo_relative"
        )
