"""Every bad input tried on the ``vitlab`` command, and the message it gets: the table of ``docs/errors.md``.

Each case runs the real command line (in this process, in a scratch folder, on data the script makes) and records
the exit code and the first line of standard error. A case that prints a traceback or exits 0 is marked as a
failure; the script fails if any command changed a file of the user's folder ``mine/`` or left a half-written
(temporary or empty) file. Run from the repository root::

    python -m benchmarks.reports.bad_inputs > /tmp/bad_inputs.md
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

import vitlab
from vitlab.cli.main import main

TINY = ["trainer.accelerator=cpu", "model.depth=1", "data.limit_train=128", "run.generate=false", "run.report=false"]
FIT = ["fit", "--config", "vit/digits", "trainer.max_epochs=1", *TINY]
#: timm's BEiT, tiny: its attention has a relative position bias and no q_norm, so vitlab cannot reach its heads
BEIT = ["model.name=timm:beit_base_patch16_224", "model.img_size=8", "model.patch_size=2", "model.embed_dim=32"]
BEIT += ["model.num_heads=2"]
REPO = str(Path(vitlab.__file__).resolve().parents[2])  # where this checkout is: <repo> in the table


def run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse
            rc = e.code
    return rc, err.getvalue()


def make_inputs(work: Path) -> dict[str, Path]:
    """A trained run, a truncated and a foreign checkpoint, a folder with a user's file, an npz without labels,
    an image folder with a broken image."""
    run_dir = work / "run"
    with contextlib.redirect_stdout(sys.stderr):
        assert main([*FIT, f"run.dir={run_dir}", "trainer.enable_progress_bar=false"]) == 0
    ckpt = (run_dir / "checkpoints" / "last.ckpt").read_bytes()
    (work / "truncated.ckpt").write_bytes(ckpt[: len(ckpt) // 2])
    (work / "foreign.ckpt").write_bytes(b"not a checkpoint")
    (work / "mine").mkdir()
    (work / "mine" / "notes.txt").write_text("my notes")
    (work / "file.txt").write_text("a file")
    x = np.zeros((8, 8, 8), np.uint8)
    np.savez(work / "nolabels.npz", x_train=x, x_test=x)
    for label in ("a", "b"):
        for i in range(4):
            (work / "pets" / label).mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(work / "pets" / label / f"{i}.png")
    broken = work / "pets" / "b" / "3.png"
    broken.write_bytes(broken.read_bytes()[:30])
    images, labels = np.random.default_rng(0).integers(0, 256, (40, 8, 8), dtype=np.uint8), np.arange(40) % 4
    npz = {"x_train": images, "y_train": labels, "x_test": images[:20], "y_test": labels[:20]}
    np.savez(work / "short_labels.npz", **{**npz, "y_train": labels[:30]})
    np.savez(work / "float_labels.npz", **{**npz, "y_train": np.random.default_rng(0).random(40)})
    np.savez(work / "sparse_labels.npz", **{**npz, "y_train": labels * 100, "y_test": labels[:20] * 100})
    np.savez(work / "unseen_labels.npz", **{**npz, "y_test": np.arange(20) % 5})
    np.savez(work / "one_class.npz", **{**npz, "y_train": labels * 0, "y_test": labels[:20] * 0})
    nchw = np.random.default_rng(0).integers(0, 256, (40, 3, 8, 8), dtype=np.uint8)
    np.savez(work / "nchw.npz", **{**npz, "x_train": nchw, "x_test": nchw[:20]})
    (work / "text.npz").write_text("not an npz file")
    (work / "folder.npz").mkdir()
    for label in ("a", "b"):
        for i in range(6):
            (work / "empty_class" / label).mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((8, 8), i, np.uint8)).save(work / "empty_class" / label / f"{i}.png")
    (work / "empty_class" / "c").mkdir()
    (work / "one_class" / "cat").mkdir(parents=True)
    (work / "two_images" / "dog").mkdir(parents=True)
    for folder in ("one_class/cat", "two_images/dog"):
        for i in range(6 if folder.startswith("one") else 1):
            Image.fromarray(np.full((8, 8), i, np.uint8)).save(work / folder / f"{i}.png")
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(work / "two_images" / "cat.png")
    (work / "two_images" / "cat").mkdir()
    os.replace(work / "two_images" / "cat.png", work / "two_images" / "cat" / "0.png")
    (work / "tab.yaml").write_text("trainer:\n\tmax_epochs: 2\n")
    (work / "syntax.yaml").write_text("model: {name: vit_pico\n")
    (work / "loop.yaml").write_text("defaults: [loop.yaml]\n")
    (work / "busy").mkdir()
    (work / "busy" / ".lock").write_text(f"{os.getpid()} {socket.gethostname()}\n")  # this process: alive
    (work / "busy_explain").mkdir()
    (work / "busy_explain" / ".explain.lock").write_text(f"{os.getpid()} {socket.gethostname()}\n")
    for name in ("report.html", "predictions.csv", "compare.md", "bench.json", "probe.json"):
        (work / "mine" / name).write_text(f"the user's {name}")
    for folder, name in (("generate", "metrics.json"), ("evaluation", "evaluation.json")):
        (work / "mine" / folder).mkdir()
        (work / "mine" / folder / name).write_text(f"the user's {name}")
    make_round_3_inputs(work, run_dir)
    (work / "mine" / "settings").mkdir()
    (work / "mine" / "settings" / "config.yaml").write_text("my: settings\n")
    (work / "mine" / "deploy").mkdir()
    (work / "mine" / "deploy" / "model.onnx").write_bytes(b"the user's model")
    make_round_4_inputs(work)
    make_round_5_inputs(work, run_dir)
    make_issue_60_cli_inputs(work, run_dir)
    make_export_number_files(work, run_dir)
    make_hf_inputs(work)
    return {"run": run_dir}


def make_round_3_inputs(work: Path, run_dir: Path) -> None:
    """A flipped byte in an export and in a checkpoint, an export whose class names miss classes, a checkpoint
    outside a run, an npz naming a class twice, a config giving a key twice, a float image."""
    for name in ("flipped_export", "two_names_export"):
        (work / name).mkdir()
        for file in ("model.safetensors", "config.json"):
            (work / name / file).write_bytes((run_dir / "export" / file).read_bytes())
    weights = bytearray((work / "flipped_export" / "model.safetensors").read_bytes())
    weights[-3] ^= 0xFF
    (work / "flipped_export" / "model.safetensors").write_bytes(bytes(weights))
    config = json.loads((work / "two_names_export" / "config.json").read_text())
    config["data"]["class_names"] = config["data"]["class_names"][:2]
    (work / "two_names_export" / "config.json").write_text(json.dumps(config))
    (work / "flipped" / "checkpoints").mkdir(parents=True)
    for file in ("last.ckpt", "last.ckpt.sha256"):
        (work / "flipped" / "checkpoints" / file).write_bytes((run_dir / "checkpoints" / file).read_bytes())
    checkpoint = bytearray((run_dir / "checkpoints" / "last.ckpt").read_bytes())
    checkpoint[len(checkpoint) // 2] ^= 0xFF
    (work / "flipped" / "checkpoints" / "last.ckpt").write_bytes(bytes(checkpoint))
    (work / "lone.ckpt").write_bytes((run_dir / "checkpoints" / "last.ckpt").read_bytes())
    images, labels = np.random.default_rng(0).integers(0, 256, (40, 8, 8), dtype=np.uint8), np.arange(40) % 4
    names = np.array(["cat", "dog", "cat", "owl"])
    np.savez(work / "twice_named.npz", x_train=images, y_train=labels, x_test=images, y_test=labels, class_names=names)
    (work / "twice.yaml").write_text("defaults: [vit/digits]\noptim:\n  lr: 0.001\n  lr: 0.01\n")
    for label in ("a", "b"):
        (work / "float_images" / label).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((8, 8), i, np.uint16)).save(work / "float_images" / label / f"{i}.png")
    Image.fromarray(np.full((8, 8), 0.5, np.float32)).save(work / "float_images" / "b" / "float.tiff")


def make_round_4_inputs(work: Path) -> None:
    """An npz whose splits differ in channels, an npz of 4-channel images, a binary config, a list as a section."""
    (work / "binary.yaml").write_bytes(bytes(range(128, 256)))
    (work / "list_section.yaml").write_text("defaults: [vit/digits]\ntrainer: [1, 2]\n")
    rng = np.random.default_rng(0)
    gray, rgb, four = (
        rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((40, 8, 8), (20, 8, 8, 3), (40, 8, 8, 4))
    )
    labels = np.arange(40) % 4
    np.savez(work / "mixed_channels.npz", x_train=gray, y_train=labels, x_test=rgb, y_test=labels[:20])
    np.savez(work / "four_channels.npz", x_train=four, y_train=labels, x_test=four[:20], y_test=labels[:20])


def make_round_5_inputs(work: Path, run_dir: Path) -> None:
    """A folder of the user's holding files at an export's names, a link to it, a run whose checkpoints/ is a link
    to a folder of the user's."""
    (work / "mine" / "weights").mkdir()
    for name in ("model.safetensors", "config.json"):
        (work / "mine" / "weights" / name).write_text("the user's")
    (work / "weights_link").symlink_to(work / "mine" / "weights")
    linked = work / "linked_run"
    (linked / "checkpoints").mkdir(parents=True)
    for name in (".vitlab-manifest.jsonl", "config.yaml", "checkpoints/best.ckpt"):
        (linked / name).write_bytes((run_dir / name).read_bytes())
    (work / "mine" / "ckpts").mkdir()
    (work / "mine" / "ckpts" / "best.ckpt").write_text("the user's")
    (linked / "checkpoints" / "best.ckpt").unlink()
    (linked / "checkpoints").rmdir()
    (linked / "checkpoints").symlink_to(work / "mine" / "ckpts")
    make_round_5_files(work, run_dir)
    make_resume_files(work, run_dir)


def make_round_5_files(work: Path, run_dir: Path) -> None:
    """An npz of Python objects and one of flat images, a timm model's weights and a garbage weights file, a run
    without its config.yaml, one without its manifest, an export whose config.json names another class count."""
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (40, 8, 8), dtype=np.uint8), np.arange(40) % 4
    names = np.array(["cat", "dog", "owl", "emu"], dtype=object)
    np.savez(work / "objects.npz", x_train=images, y_train=labels, x_test=images, y_test=labels, class_names=names)
    flat = images.reshape(40, 64)
    np.savez(work / "flat.npz", x_train=flat, y_train=labels, x_test=flat, y_test=labels)
    import timm
    from safetensors.torch import save_file

    save_file(timm.create_model("deit_tiny_patch16_224", img_size=32).state_dict(), work / "deit.safetensors")
    (work / "garbage.safetensors").write_bytes(b"garbage, not a safetensors file")
    for name, files in {
        "no_config": (".vitlab-manifest.jsonl", "checkpoints/last.ckpt"),
        "no_manifest": ("config.yaml", "metrics.jsonl", "checkpoints/last.ckpt"),
        "edited_export": ("export/model.safetensors", "export/config.json"),
    }.items():
        for file in files:
            (work / name / file).parent.mkdir(parents=True, exist_ok=True)
            (work / name / file).write_bytes((run_dir / file).read_bytes())
    config = json.loads((work / "edited_export" / "export" / "config.json").read_text())
    config["kwargs"]["num_classes"] = 5
    (work / "edited_export" / "export" / "config.json").write_text(json.dumps(config))


def make_resume_files(work: Path, run_dir: Path) -> None:
    """Copies of the run whose config.yaml a user edited: a learning rate changed, the file emptied."""
    import shutil

    for name, edit in {
        "edited_lr": lambda text: text.replace("lr: 0.002", "lr: 0.01"),
        "emptied": lambda _: "\n",
    }.items():
        shutil.copytree(run_dir, work / name)
        (work / name / "config.yaml").write_text(edit((run_dir / "config.yaml").read_text()))


def make_issue_60_cli_inputs(work: Path, run_dir: Path) -> None:
    """Issue 60: links to a user's folder holding maps.npz and to a user's predictions, an empty and a comment-only
    config, brackets nested 2,000 deep, a live export's lock, a run whose last.ckpt is a link to a user's file."""
    (work / "mine" / "maps").mkdir()
    (work / "mine" / "maps" / "maps.npz").write_bytes(b"the user's maps")
    (work / "maps_link").symlink_to(work / "mine" / "maps")
    (work / "predictions_link.csv").symlink_to(work / "mine" / "predictions.csv")
    (work / "empty.yaml").write_text("# settings to come\n")
    (work / "deep.yaml").write_text("model: " + "[" * 2000 + "]" * 2000 + "\n")
    (work / ".busy_export.export.lock").write_text(f"{os.getpid()} {socket.gethostname()}\n")  # this process: alive
    linked = work / "linked_last"
    (linked / "checkpoints").mkdir(parents=True)
    for name in (".vitlab-manifest.jsonl", "config.yaml"):
        (linked / name).write_bytes((run_dir / name).read_bytes())
    (work / "mine" / "last.ckpt").write_bytes((run_dir / "checkpoints" / "last.ckpt").read_bytes())
    (linked / "checkpoints" / "last.ckpt").symlink_to(work / "mine" / "last.ckpt")


def make_export_number_files(work: Path, run_dir: Path) -> None:
    """Exports whose config.json normalisation is NaN, or a std of 0 (every prediction would be NaN)."""
    for name, key, value in (("nan_mean_export", "mean", [float("nan")]), ("zero_std_export", "std", [0.0])):
        for file in ("model.safetensors", "config.json"):
            (work / name / file).parent.mkdir(parents=True, exist_ok=True)
            (work / name / file).write_bytes((run_dir / "export" / file).read_bytes())
        config = json.loads((work / name / "config.json").read_text())
        config["data"][key] = value
        (work / name / "config.json").write_text(json.dumps(config))


@contextlib.contextmanager
def without_onnxscript():
    """``import onnxscript`` fails, as where the onnx extra is not installed."""
    saved = sys.modules.get("onnxscript")
    sys.modules["onnxscript"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if saved is None:
            del sys.modules["onnxscript"]
        else:
            sys.modules["onnxscript"] = saved


@contextlib.contextmanager
def disk_full():
    """Every file written after this point meets a full disk (what a 5 MiB tmpfs does to a checkpoint)."""
    real = os.fsync

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    os.fsync = full
    try:
        yield
    finally:
        os.fsync = real


@contextlib.contextmanager
def logits_plus_their_sign():
    """The ViT's logits plus their own sign: an operation held constant in a sum, which only LRP's rules find."""
    from vitlab.models.vit import VisionTransformer

    head = VisionTransformer.forward_head
    VisionTransformer.forward_head = lambda self, x, **kw: (y := head(self, x, **kw)) + y.sign()
    try:
        yield
    finally:
        VisionTransformer.forward_head = head


def cases(work: Path, run_dir: Path) -> list[tuple]:
    """``(name, argv)`` or ``(name, argv, context)``: ``context()`` is entered around the command (a full disk)."""

    cait = [*FIT, "model.name=timm:cait_xxs24_224", "model.img_size=8", "model.patch_size=2", "model.depth=2"]
    cait += ["dynamics.mode=fixed", "dynamics.freeze=false"]

    def mine(name: str) -> str:
        return str(work / "mine" / name)

    timm_explain = [
        "explain",
        "--model",
        "timm:deit_tiny_patch16_224",
        str(work / "pets" / "a"),
        "--method",
        "lrp",
        "--out",
        str(work / "timm_maps"),
    ]

    return [
        ("unknown config key", [*FIT, "optim.lrr=1e-3"]),
        ("value of the wrong type", [*FIT, "trainer.max_epochs=ten"]),
        ("malformed override", [*FIT, "optim.lr"]),
        ("unknown command-line flag", ["fit", "--config", "vit/digits", "--lr", "1e-3"]),
        ("config file not found", ["fit", "--config", "vit/digitz"]),
        ("unknown model", [*FIT, "model.name=vit_tinyy"]),
        ("unknown model option", [*FIT, "model.embed_dimm=64"]),
        ("unknown timm model", [*FIT, "model.name=timm:deit_tiny_patch16_22"]),
        ("an option timm's model does not take", [*FIT, "model.name=timm:deit_tiny_patch16_224", "model.foo=3"]),
        ("freezing the heads of a model whose attention is only observed", [*FIT, *BEIT, "dynamics.mode=fixed"]),
        (
            "model.temperature on a timm attention whose query vitlab cannot reach",
            [*FIT, *BEIT, "model.temperature=true"],
        ),
        (
            "freezing the heads of a qk-norm ViT (the norm's weight is shared by its heads)",
            [
                *FIT,
                "model.name=timm:vit_tiny_patch16_224",
                "model.img_size=8",
                "model.patch_size=2",
                "model.qk_norm=true",
                "dynamics.mode=fixed",
            ],
        ),
        *timm_cases(work),
        *hf_cases(work),
        *hf_model_cases(work),
        *torchvision_cases(work),
        ("observing a model whose attention vitlab cannot read (CaiT's talking heads)", cait),
        ("observing only CaiT's class attention (one CLS query)", [*cait, "dynamics.target=blocks_token_only"]),
        ("a layer-freezing option without `dynamics.freeze=layers`", [*FIT, "dynamics.layer_signal=gradnorm"]),
        (
            "static layer freezing without a count",
            [*FIT, "dynamics.freeze=layers", "dynamics.layer_signal=static"],
        ),
        (
            "caching a frozen prefix that random augmentation reaches",
            [*FIT, "dynamics.mode=fixed", "dynamics.freeze=layers", "dynamics.cache_frozen=true"],
        ),
        ("patch size does not divide the image", [*FIT, "model.patch_size=3", f"run.dir={work / 'p3'}"]),
        ("unknown dataset", [*FIT, "data.name=imagenet-1k"]),
        ("dataset files missing", [*FIT, "data.name=mnist", f"data.root={work / 'nothing'}"]),
        ("npz file not given", [*FIT, "data.name=npz"]),
        ("npz without labels", [*FIT, "data.name=npz", f"data.path={work / 'nolabels.npz'}"]),
        (
            "unreadable image, data.strict_images=true",
            [*FIT, "data.name=imagefolder", f"data.path={work / 'pets'}", "data.strict_images=true"],
        ),
        ("data.in_chans on a fixed dataset", [*FIT, "data.in_chans=3"]),
        ("negative batch size", [*FIT, "data.batch_size=0"]),
        ("run directory already holds a run", [*FIT, f"run.dir={run_dir}"]),
        ("training diverges (NaN loss)", [*FIT, "optim.lr=1e3", "trainer.max_epochs=10", f"run.dir={work / 'nan'}"]),
        ("--resume of a folder that does not exist", ["fit", "--resume", str(work / "runs" / "nope")]),
        ("--resume of a truncated checkpoint", ["fit", "--resume", str(work / "truncated.ckpt")]),
        ("test on a foreign file", ["test", str(work / "foreign.ckpt")]),
        ("export of a truncated checkpoint", ["export", str(work / "truncated.ckpt")]),
        ("export into a folder with a user's files", ["export", str(run_dir), "--out", str(work / "mine")]),
        ("export onto a file", ["export", str(run_dir), "--out", str(work / "file.txt")]),
        ("dynamics of a run trained without them", ["dynamics", str(run_dir)]),
        ("evaluate a folder that is not a run", ["evaluate", str(work / "mine")]),
        ("load a model option that changes the weights", ["evaluate", str(run_dir), "--model", "embed_dim=32"]),
        ("a model option that does not exist", ["evaluate", str(run_dir), "--model", "tome_rr=2"]),
        ("dynamics of a folder that does not exist", ["dynamics", str(work / "nope")]),
        ("test of a run that does not exist", ["test", str(work / "nope")]),
        ("report of a folder that is not a run", ["report", str(work / "mine")]),
        ("compare of a folder that is not a run", ["compare", str(run_dir), str(work / "mine")]),
        ("generate on a run that is not a ViTCAE", ["generate", str(run_dir)]),
        ("slot assignments of a run that is not a CET-ViT", ["probe", "slot-k", str(run_dir)]),
        ("bench of an unknown model", ["bench", "vit_tinyy"]),
        ("list-models with a pattern that matches nothing", ["list-models", "zzz*"]),
        # issue 26: nothing lost
        ("--resume with another config", ["fit", "--config", "vitcae/digits", "--resume", str(run_dir)]),
        ("--resume with another model", ["fit", "--resume", str(run_dir), "model.name=vit_pico"]),
        ("a run folder another vitlab fit is writing", [*FIT, f"run.dir={work / 'busy'}"]),
        ("report onto a user's file", ["report", str(run_dir), "--out", str(work / "mine" / "report.html")]),
        (
            "predict onto a user's file",
            ["predict", str(run_dir), str(work / "pets" / "a"), "--out", mine("predictions.csv")],
        ),
        ("compare onto a user's file", ["compare", str(run_dir), "--out", mine("compare.md")]),
        ("generate into a folder with a metrics.json", ["generate", str(run_dir), "--out", mine("generate")]),
        ("evaluate into a folder with an evaluation.json", ["evaluate", str(run_dir), "--out", mine("evaluation")]),
        ("probe --json onto a user's file", ["probe", "reversibility", "--json", mine("probe.json")]),
        ("bench onto a user's file", ["bench", "vit_pico", "--out", mine("bench.json")]),
        (
            "a full disk during predict --out",
            ["predict", str(run_dir), str(work / "pets" / "a"), "--out", mine("new.csv")],
            disk_full,
        ),
        ("a full disk during fit", [*FIT, f"run.dir={work / 'full'}"], disk_full),
        ("a full disk during export", ["export", str(run_dir), "--out", str(work / "exported")], disk_full),
        # issue 26: nothing silently wrong
        ("npz with fewer labels than images", [*FIT, "data.name=npz", f"data.path={work / 'short_labels.npz'}"]),
        ("npz with fractional float labels", [*FIT, "data.name=npz", f"data.path={work / 'float_labels.npz'}"]),
        ("npz labels 0, 100, 200, 300", [*FIT, "data.name=npz", f"data.path={work / 'sparse_labels.npz'}"]),
        (
            "npz test labels outside the training labels",
            [*FIT, "data.name=npz", f"data.path={work / 'unseen_labels.npz'}"],
        ),
        ("npz with a single class", [*FIT, "data.name=npz", f"data.path={work / 'one_class.npz'}"]),
        ("model.num_classes below the labels", [*FIT, "model.num_classes=5"]),
        (
            "image folder with an empty class folder",
            [*FIT, "data.name=imagefolder", f"data.path={work / 'empty_class'}"],
        ),
        ("image folder with one class", [*FIT, "data.name=imagefolder", f"data.path={work / 'one_class'}"]),
        ("image folder with two images", [*FIT, "data.name=imagefolder", f"data.path={work / 'two_images'}"]),
        ("compare with the same run twice", ["compare", str(run_dir), str(run_dir)]),
        ("trainer.max_epochs=0", [*FIT, "trainer.max_epochs=0"]),
        # issue 26: tracebacks that are one line now
        ("YAML syntax error", ["fit", "--config", str(work / "syntax.yaml")]),
        ("YAML indented with a tab", ["fit", "--config", str(work / "tab.yaml")]),
        ("defaults that include themselves", ["fit", "--config", str(work / "loop.yaml")]),
        ("npz that is not a zip", [*FIT, "data.name=npz", f"data.path={work / 'text.npz'}"]),
        ("npz path that is a folder", [*FIT, "data.name=npz", f"data.path={work / 'folder.npz'}"]),
        ("npz images in NCHW order", [*FIT, "data.name=npz", f"data.path={work / 'nchw.npz'}"]),
        ("an image size whose first batch cannot fit in memory", [*FIT, "data.img_size=100000"]),
        ("negative learning rate", [*FIT, "optim.lr=-1e-3"]),
        ("a trainer value Lightning refuses", [*FIT, "trainer.strategy=ddpp"]),
        ("evaluate --severities outside 1..5", ["evaluate", str(run_dir), "--severities", "9"]),
        # issue 43: nothing lost, nothing silently wrong, round 3
        ("a model of depth 0", [*FIT, "model.depth=0"]),
        ("a key given twice in a config file", ["fit", "--config", str(work / "twice.yaml")]),
        ("a run name that leaves run.root", [*FIT, "run.name=../../x"]),
        ("an export with a flipped byte", ["predict", str(work / "flipped_export"), str(work / "pets" / "a")]),
        ("a checkpoint with a flipped byte", ["test", str(work / "flipped" / "checkpoints" / "last.ckpt")]),
        ("an export naming 2 of 10 classes", ["predict", str(work / "two_names_export"), str(work / "pets" / "a")]),
        ("npz naming a class twice", [*FIT, "data.name=npz", f"data.path={work / 'twice_named.npz'}"]),
        ("export of a checkpoint outside a run, no --out", ["export", str(work / "lone.ckpt")]),
        (
            "--device cuda on a machine without CUDA",
            ["predict", str(run_dir), str(work / "pets" / "a"), "--device", "cuda"],
        ),
        (
            "a float image (PIL mode F), data.strict_images=true",
            [*FIT, "data.name=imagefolder", f"data.path={work / 'float_images'}", "data.strict_images=true"],
        ),
        # issue 43: a user's file is sacred
        ("run.dir holding a user's files, no manifest", [*FIT, f"run.dir={work / 'mine'}", "run.overwrite=true"]),
        ("run.dir holding a user's config.yaml", [*FIT, f"run.dir={mine('settings')}", "run.overwrite=true"]),
        (
            "export --force --format onnx onto a user's model.onnx",
            ["export", str(run_dir), "--out", mine("deploy"), "--force", "--format", "onnx"],
        ),
        (
            "a second explain into the same --out at once",
            [
                "explain",
                str(run_dir),
                str(work / "pets" / "a"),
                "--method",
                "attention",
                "--out",
                str(work / "busy_explain"),
            ],
        ),
        # issue 43, round 4
        ("npz: gray training and RGB test images", [*FIT, "data.name=npz", f"data.path={work / 'mixed_channels.npz'}"]),
        ("npz of 4-channel images", [*FIT, "data.name=npz", f"data.path={work / 'four_channels.npz'}"]),
        ("evaluate --tta-views beyond the views", ["evaluate", str(run_dir), "--tta-views", "9"]),
        ("evaluate --max-batches 0", ["evaluate", str(run_dir), "--max-batches", "0"]),
        ("evaluate --tta-shift 0", ["evaluate", str(run_dir), "--tta-shift", "0"]),
        ("a negative seed", [*FIT, "run.seed=-1"]),
        ("a seed above 2**32-1", [*FIT, f"run.seed={2**32}"]),
        ("a config file that is not UTF-8 text", ["fit", "--config", str(work / "binary.yaml")]),
        ("a config section that is a list", ["fit", "--config", str(work / "list_section.yaml")]),
        (
            "explain --out an existing file",
            ["explain", str(run_dir), str(work / "pets" / "a"), "--method", "rollout", "--out", str(work / "file.txt")],
        ),
        # issue 52, round 5
        (
            "export --force onto a user's model.safetensors",
            ["export", str(run_dir), "--out", mine("weights"), "--force"],
        ),
        ("export --force through a link", ["export", str(run_dir), "--out", str(work / "weights_link"), "--force"]),
        (
            "run.overwrite of a run whose checkpoints/ is a link",
            [*FIT, f"run.dir={work / 'linked_run'}", "run.overwrite=true"],
        ),
        ("npz holding Python objects", [*FIT, "data.name=npz", f"data.path={work / 'objects.npz'}"]),
        ("npz of flat images", [*FIT, "data.name=npz", f"data.path={work / 'flat.npz'}"]),
        (
            "explain a timm model with garbage --weights",
            [*timm_explain, "--weights", str(work / "garbage.safetensors")],
        ),
        (
            "explain a timm model at --img-size 0",
            [*timm_explain, "--weights", str(work / "deit.safetensors"), "--img-size", "0"],
        ),
        (
            "explain a timm model at --img-size 17",
            [*timm_explain, "--weights", str(work / "deit.safetensors"), "--img-size", "17"],
        ),
        ("--resume of a run that lost its config.yaml", ["fit", "--resume", str(work / "no_config")]),
        (
            "run.overwrite of a run that lost its manifest",
            [*FIT, f"run.dir={work / 'no_manifest'}", "run.overwrite=true"],
        ),
        (
            "an export whose config.json was edited",
            ["predict", str(work / "edited_export" / "export"), str(work / "pets")],
        ),
        (
            "explain --method lrp of a model whose operations LRP's rules refuse (its logits plus their sign)",
            ["explain", str(run_dir), str(work / "pets" / "a"), "--method", "lrp", "--out", str(work / "lrp_maps")],
            logits_plus_their_sign,
        ),
        # issue 60: what a resume may change
        ("--resume with a learning rate", ["fit", "--resume", str(run_dir), "optim.lr=0.1"]),
        ("--resume of a run whose config.yaml has another lr", ["fit", "--resume", str(work / "edited_lr")]),
        ("--resume of a run whose config.yaml was emptied", ["fit", "--resume", str(work / "emptied")]),
        ("--resume that adds a dynamics section", ["fit", "--resume", str(run_dir), "dynamics.mode=fixed"]),
        ("an export whose config.json mean is NaN", ["predict", str(work / "nan_mean_export"), str(work / "pets")]),
        ("an export whose config.json std is 0", ["predict", str(work / "zero_std_export"), str(work / "pets")]),
        (
            "export --format onnx without onnxscript",
            ["export", str(run_dir), "--out", str(work / "no_onnxscript"), "--format", "onnx"],
            without_onnxscript,
        ),
        *issue_60_cli_cases(work, run_dir),
    ]


def issue_60_cli_cases(work: Path, run_dir: Path) -> list[tuple]:
    """Issue 60 (round 5): links under --force, names the file system refuses, configs without settings or too deep
    to read, stray arguments, a second export at once, list-configs without a match, a resume through a link."""
    explain = ["explain", str(run_dir), str(work / "pets" / "a"), "--method", "attention", "--out"]
    return [
        ("explain --force through a link", [*explain, str(work / "maps_link"), "--force"]),
        (
            "predict --force onto a link",
            ["predict", str(run_dir), str(work / "pets" / "a"), "--out", str(work / "predictions_link.csv"), "--force"],
        ),
        ("a run.dir folder name over 255 bytes", [*FIT, f"run.dir={work / ('x' * 300)}"]),
        ("a run.dir path over 4,096 bytes", [*FIT, f"run.dir={work / (('y' * 250 + '/') * 17)}"]),
        ("a YAML with 2,000 nested brackets", ["fit", "--config", str(work / "deep.yaml")]),
        ("a comment-only (or empty, or ---) config", ["fit", "--config", str(work / "empty.yaml")]),
        ("a stray positional argument", ["test", str(run_dir), str(run_dir)]),
        (
            "explain a run with --model",
            [
                "explain",
                str(run_dir),
                "--model",
                "timm:deit_tiny_patch16_224",
                str(work / "pets" / "a"),
                "--method",
                "lrp",
                "--out",
                str(work / "o"),
            ],
        ),
        ("a second export into the same --out at once", ["export", str(run_dir), "--out", str(work / "busy_export")]),
        ("list-configs with a pattern nothing matches", ["list-configs", "foo"]),
        ("--resume of a run whose last.ckpt is a link", ["fit", "--resume", str(work / "linked_last")]),
    ]


def make_hf_inputs(work: Path) -> None:
    """Hugging Face datasets (save_to_disk folders): one whose image column has another name, one with an unreadable
    image, one with unlabelled test rows, one without a train split, one of float arrays."""
    import datasets

    datasets.disable_progress_bars()
    images = [Image.fromarray(x) for x in np.random.default_rng(0).integers(0, 256, (40, 8, 8), dtype=np.uint8)]
    pets = datasets.Dataset.from_dict({"photo": images, "label": [i % 4 for i in range(40)]})
    pets = pets.cast_column("label", datasets.ClassLabel(names=["cat", "dog", "fox", "owl"]))
    pets.save_to_disk(str(work / "hf_pets"))
    rows = pets.cast_column("photo", datasets.Image(decode=False)).to_list()
    rows[3]["photo"] = {"bytes": b"not an image", "path": None}
    datasets.Dataset.from_list(rows, features=pets.features).save_to_disk(str(work / "hf_broken"))
    unlabelled = pets.select(range(8)).map(lambda row: {"label": -1})
    datasets.DatasetDict(train=pets, test=unlabelled).save_to_disk(str(work / "hf_unlabelled"))
    datasets.DatasetDict(everything=pets).save_to_disk(str(work / "hf_unsplit"))
    floats = {"pixel_values": list(np.zeros((40, 8, 8))), "label": [i % 2 for i in range(40)]}
    datasets.Dataset.from_dict(floats).save_to_disk(str(work / "hf_floats"))


def hf_cases(work: Path) -> list[tuple]:
    """Hugging Face datasets as data (``data.name=hf``): what each bad folder gets, before the run folder."""
    return [
        ("hf dataset not given", [*FIT, "data.name=hf"]),
        ("hf: a folder that is no dataset", [*FIT, f"data.name=hf:{work / 'pets'}"]),
        ("hf: an image column misspelt", [*FIT, f"data.name=hf:{work / 'hf_pets'}", "data.image_column=foto"]),
        (
            "hf: an unreadable image, data.strict_images=true",
            [*FIT, f"data.name=hf:{work / 'hf_broken'}", "data.strict_images=true"],
        ),
        ("hf: test rows labelled -1", [*FIT, f"data.name=hf:{work / 'hf_unlabelled'}"]),
        ("hf: no train split", [*FIT, f"data.name=hf:{work / 'hf_unsplit'}"]),
        ("hf: float arrays as images", [*FIT, f"data.name=hf:{work / 'hf_floats'}"]),
    ]


def torchvision_cases(work: Path) -> list[tuple]:
    """A torchvision model trained by name, and timm or torchvision weights from a file that does not fit: refused
    before the run folder, in one line."""
    import timm
    import torch
    import torchvision
    from timm.models._hub import save_for_hf

    torch.save(torchvision.models.resnet18(num_classes=3).state_dict(), work / "resnet.pth")
    save_for_hf(timm.create_model("vit_small_patch16_224", img_size=8, patch_size=2, depth=1), str(work / "vit_hub"))
    vit = ["model.name=tv:vision_transformer", "model.patch_size=2", "model.num_layers=1", "model.num_heads=2"]
    vit += ["model.hidden_dim=16", "model.mlp_dim=32"]
    fit = [a for a in FIT if a != "model.depth=1"]  # torchvision's ViT counts its layers in num_layers
    hub = f"model.pretrained={work / 'vit_hub'}"
    return [
        ("unknown torchvision model", [*fit, "model.name=tv:vit_b_61"]),
        ("a size torchvision's named model fixes", [*fit, "model.name=tv:vit_b_16", "model.patch_size=2"]),
        ("torchvision's ViT class without its sizes", [*fit, "model.name=tv:vision_transformer"]),
        ("weights of another torchvision architecture", [*fit, *vit, f"model.pretrained={work / 'resnet.pth'}"]),
        (
            "a timm hub folder of another architecture",
            [*FIT, "model.name=timm:deit_tiny_patch16_224", "model.img_size=8", "model.patch_size=2", hub],
        ),
    ]


def timm_cases(work: Path) -> list[tuple]:
    """A timm model trained by name: what its built model refuses, before the run folder, in one line."""
    deit, tiny = "model.name=timm:deit_tiny_patch16_224", ["model.img_size=8", "model.patch_size=2"]
    observe = ["dynamics.mode=fixed", "dynamics.freeze=false"]
    swin = [
        "model.img_size=8",
        "model.patch_size=2",
        "model.window_size=2",
        "model.depths=[1,1]",
        "model.num_heads=[1,2]",
    ]
    swin += ["model.embed_dim=8", "dynamics.mode=fixed"]
    return [
        ("an empty timm model name", [*FIT, "model.name=timm:"]),
        ("timm's weights named in model.name", [*FIT, "model.name=timm:deit_tiny_patch16_224.fb_in1k"]),
        (
            "a timm model whose patch size does not divide the image",
            [*FIT, deit, "model.img_size=8", "model.patch_size=3", f"run.dir={work / 'timm_p3'}"],
        ),
        (
            "a timm ViT without a CLS token under the dynamics controller",
            [*FIT, deit, *tiny, "model.class_token=false", "model.global_pool=avg", *observe],
        ),
        (
            "a timm model without a CLS token, freezing on (every reason at once)",
            [*FIT, "model.name=timm:vit_relpos_small_patch16_224", *tiny, "dynamics.mode=fixed"],
        ),
        (  # without FIT's model.depth, which timm's Swin does not take
            "timm's windowed Swin, freezing on (every reason at once)",
            [*(a for a in FIT if a != "model.depth=1"), "model.name=timm:swin_tiny_patch4_window7_224", *swin],
        ),
        (  # without FIT's model.depth, which a ResNet does not take
            "the dynamics controller on a timm CNN",
            [*(a for a in FIT if a != "model.depth=1"), "model.name=timm:resnet18", *observe],
        ),
        (
            "explain a timm model with an attention method",
            [
                "explain",
                "--model",
                "timm:deit_tiny_patch16_224",
                str(work / "pets" / "a"),
                "--method",
                "rollout",
                "--out",
                str(work / "timm_maps"),
                "--weights",
                str(work / "deit.safetensors"),
                "--img-size",
                "32",
            ],
        ),
    ]


def hf_model_cases(work: Path) -> list[tuple]:
    """An HF transformers model trained by name (hf:TYPE) or from a save_pretrained folder (hf:PATH), refused before
    the run folder, in one line."""
    (work / "hf_empty").mkdir(exist_ok=True)
    (work / "hf_noweights").mkdir(exist_ok=True)
    (work / "hf_noweights" / "config.json").write_text(json.dumps({"model_type": "vit", "patch_size": 2}))
    return [
        ("unknown HF transformers model type", [*FIT, "model.name=hf:vitt"]),
        ("an HF model type without an image classifier", [*FIT, "model.name=hf:bert"]),
        ("an empty HF model name", [*FIT, "model.name='hf:'"]),
        ("an option the HF config class does not have", [*FIT, "model.name=hf:swin", "model.depth=2"]),
        (
            "one HF config key set under two names",
            [*FIT, "model.name=hf:vit", "model.embed_dim=16", "model.hidden_size=16"],
        ),
        ("an HF hub id as model.name (no hub)", [*FIT, "model.name=hf:google/vit-base-patch16-224"]),
        ("an HF folder without config.json", [*FIT, f"model.name=hf:{work / 'hf_empty'}"]),
        ("an HF folder without weights", [*FIT, f"model.name=hf:{work / 'hf_noweights'}"]),
        (
            "an HF folder under another model type",
            [*FIT, "model.name=hf:deit", f"model.pretrained={work / 'hf_noweights'}"],
        ),
    ]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def main_table() -> int:
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cwd = os.getcwd()
        os.chdir(work)
        try:
            inputs = make_inputs(work)
            rows = []
            before = snapshot(work / "mine")
            for name, argv, *context in cases(work, inputs["run"]):
                with (context[0] if context else contextlib.nullcontext)():
                    rc, err = run(argv)
                lines = err.strip().splitlines()
                first = next(
                    (line for line in lines if "error:" in line or "stopped:" in line), lines[0] if lines else ""
                )
                ok = rc != 0 and "Traceback" not in err and first != ""
                failures += not ok
                shown = first.replace(str(work), "<tmp>").replace(REPO, "<repo>").replace("|", "\\|")
                shown_argv = ["fit", "--config", "vit/digits", *argv[len(FIT) :]] if argv[: len(FIT)] == FIT else argv
                command = " ".join(a.replace(str(work), "<tmp>") for a in shown_argv)
                flag = "" if ok else " **(not a clean error)**"
                rows.append(f"| {name} | `vitlab {command}` | {rc} | {shown}{flag} |")
            if snapshot(work / "mine") != before:
                print("a command changed or deleted a user's file in mine/", file=sys.stderr)
                failures += 1
            half = [p for p in work.rglob("*") if p.is_file() and (p.name.endswith(".tmp") or p.stat().st_size == 0)]
            half = [p for p in half if p.parent.name not in ("empty_class", "c")]
            if half:
                print(f"half-written files left: {', '.join(map(str, half))}", file=sys.stderr)
                failures += 1
        finally:
            os.chdir(cwd)
    print("| input | command | exit | message (first line of stderr) |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main_table())
