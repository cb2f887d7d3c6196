"""``vitlab explain`` on files and on a run's test set: what the command calls, so it stays thin."""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitlab.claim import RunClaim
from vitlab.config.model import TIMM_PREFIX
from vitlab.data.sources import class_names_problem
from vitlab.data.transforms import denormalize
from vitlab.errors import ConfigError
from vitlab.evaluation.predict import load_predictor, normalise, readable_images
from vitlab.evaluation.target import load_evaluation_target
from vitlab.explain.adapters import OVERVIEW_METHODS
from vitlab.explain.api import explain, explainer_on
from vitlab.explain.evaluate import evaluate_methods
from vitlab.explain.figures import TITLES, faithfulness_figure, overlay_grid
from vitlab.jsonio import strict_dumps
from vitlab.rundir import RunDir, check_outputs, environment, locate_model, save_figure, write_output

EXPLAIN_DIR = "explain"
EVALUATION_JSON = "explain_evaluation.json"
EVALUATION_TABLE = "explain_evaluation.md"
EVALUATION_FIGURE = "explain_faithfulness.png"
OVERLAY_FIGURE = "explain_overlays.png"
MAPS_FILE = "maps.npz"
EXPLAIN_LOCK = ".explain.lock"


def load_timm(spec: str, weights: str | Path, img_size: int | None = None) -> tuple[torch.nn.Module, dict[str, Any]]:
    """``timm:NAME`` built offline with the weights of a local file (``.safetensors``, or ``.pth``/``.pt`` read
    with ``weights_only=True``; a ``state_dict`` or ``model`` entry is unwrapped), and the data description its
    pretrained config gives (``img_size`` overrides the input size). The number of classes is read off the
    classifier's weight."""
    import timm

    name, path = spec.removeprefix(TIMM_PREFIX), Path(weights)
    if not timm.is_model(name):
        raise ConfigError(f"timm has no model {name!r}; name one of timm.list_models() as --model timm:NAME")
    if not path.is_file():
        raise ConfigError(f"--weights {path} is not a file; pass the model's .safetensors or .pth file")
    if img_size is not None and img_size < 1:
        raise ConfigError(
            f"--img-size must be at least 1, got {img_size}; pass the model's input size, or leave it out"
        )
    state = _read_weights(path)
    cfg = timm.get_pretrained_cfg(name)
    classifier = cfg.classifier if isinstance(cfg.classifier, str) else cfg.classifier[0]
    kwargs: dict[str, Any] = {"img_size": img_size} if img_size is not None else {}
    if f"{classifier}.weight" in state:
        kwargs["num_classes"] = state[f"{classifier}.weight"].shape[0]
    model = timm.create_model(name, pretrained=False, **kwargs)
    patch = getattr(getattr(model, "patch_embed", None), "patch_size", None)
    patch = patch[0] if isinstance(patch, tuple | list) else patch
    if img_size is not None and isinstance(patch, int) and img_size % patch:
        raise ConfigError(
            f"--img-size {img_size} is not a multiple of timm:{name}'s patch size {patch}; pass a multiple such as "
            f"{max(1, round(img_size / patch)) * patch}, or leave --img-size out ({cfg.input_size[-1]})"
        )
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = str(e).splitlines()[1].strip() if len(str(e).splitlines()) > 1 else str(e)
        raise ConfigError(f"--weights {path} do not fit timm:{name} ({first}); check the name and --img-size") from e
    info = {
        "img_size": img_size or cfg.input_size[-1],
        "in_chans": cfg.input_size[0],
        "mean": list(cfg.mean),
        "std": list(cfg.std),
        "class_names": None,
    }
    return model.eval(), info


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The state dict of a ``.safetensors`` file, or of a ``.pth``/``.pt`` one read with ``weights_only=True`` (a
    ``state_dict`` or ``model`` entry unwrapped); a file neither reader takes is a one-line :class:`ConfigError`."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(path)
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors' SafetensorError, torch's UnpicklingError / RuntimeError on a foreign file
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"--weights {path} cannot be read ({type(e).__name__}: {reason}): the file is corrupt or not the "
            "model's weights; pass its .safetensors or .pth file"
        ) from e
    return state.get("state_dict", state.get("model", state)) if isinstance(state, dict) else state


def _test_metrics(target: str | Path) -> dict[str, Any] | None:
    """The run's ``test_metrics.json`` (what the explained model scores), or None for a lone export."""
    run_dir = locate_model(target).run_dir
    return None if run_dir is None else RunDir(run_dir).test_metrics()


def _lscpu() -> str | None:
    """``lscpu``'s report (model, cores, flags), where the command exists: the CPU a timing ran on."""
    import subprocess

    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _progress(items: Sequence[Any], desc: str) -> Iterable[Any]:
    """A progress bar over ``items`` when there are many (more than 16); tqdm comes with Lightning."""
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="image", disable=len(items) <= 16)


def claim_output_folder(out_dir: str | Path) -> RunClaim:
    """The claim of an ``--out`` folder for one ``vitlab explain`` (``<out>/.explain.lock``, created with
    ``O_EXCL``): a second one at once is refused in one line naming the lock, rather than losing a ``maps.npz``."""
    return RunClaim(out_dir, lock=EXPLAIN_LOCK, what="explain folder", other="--out")


def _check_names(names: Sequence[str] | None, model: torch.nn.Module) -> None:
    """``names`` (``--class-names``) must name every class of ``model``."""
    classes = getattr(model, "num_classes", None)
    problem = class_names_problem(names, classes) if names is not None and classes is not None else None
    if problem:
        raise ConfigError(f"--class-names {problem}; give each class one name")


def check_out_folder(out_dir: Path) -> None:
    """``--out`` names a folder (new or existing), never a file."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir} is a file, not a folder; pass --out a new folder (or one to write into)")


def overlay_names(files: Sequence[Path], method: str) -> list[str]:
    """``<stem>_<method>.png`` for each file; where two files share a stem (``a/cat.png``, ``b/cat.png``), their
    path relative to the folder all the files are in, ``/`` and ``.`` written ``__`` and ``_`` (``a__cat_png``)."""
    paths = [Path(f).absolute() for f in files]
    if len(set(paths)) != len(paths):
        twice = next(p for p in paths if paths.count(p) > 1)
        raise ConfigError(f"{twice} is given twice; name each image once")
    stems = [p.stem for p in paths]
    root = Path(os.path.commonpath([p.parent for p in paths]))
    names = [
        stem if stems.count(stem) == 1 else str(p.relative_to(root)).replace(os.sep, "__").replace(".", "_")
        for stem, p in zip(stems, paths, strict=True)
    ]
    return [f"{name}_{method}.png" for name in names]


def _read_images(files: Sequence[Path], info: dict[str, Any], on_error: Any) -> tuple[list[Path], list[torch.Tensor]]:
    """The readable files and their pixels (:func:`read_image`); each unreadable one goes to ``on_error(path, e)``."""
    readable = list(readable_images(files, info, on_error))
    if not readable:
        raise ConfigError(f"none of the {len(files)} files given is a readable image")
    return [path for path, _ in readable], [image for _, image in readable]


def explain_files(
    target: str | Path,
    files: Sequence[Path],
    *,
    method: str,
    out_dir: str | Path,
    target_class: int | None = None,
    force: bool = False,
    batch_size: int = 16,
    class_names: Sequence[str] | None = None,
    on_error: Any = None,
    weights: str | Path | None = None,
    img_size: int | None = None,
) -> list[Path]:
    """Explain each image file with ``method``: ``<out>/<stem>_<method>.png`` (the overlay, :func:`overlay_names`)
    and ``<out>/maps.npz`` (``maps [B, H, W]``, ``target``, ``score``, ``conservation``, ``files``). ``class_names``
    captions the overlays where the run stored none (an npz file without ``class_names``). A file that cannot be
    read as an image is passed to ``on_error(path, exception)`` and skipped, as :func:`vitlab.evaluation.predict`
    does. ``target`` may be ``timm:NAME`` with its ``weights`` file (:func:`load_timm`)."""
    if str(target).startswith(TIMM_PREFIX):
        if weights is None:
            raise ConfigError(f"{target} needs --weights FILE (a local .safetensors or .pth file; no download)")
        model, info = load_timm(str(target), weights, img_size)
    else:
        model, info = load_predictor(target)
    side = int(info["img_size"])
    example = torch.randn(1, int(info["in_chans"]), side, side, generator=torch.Generator().manual_seed(0))
    explainer_on(model, example, (method,)).check(method)
    _check_names(class_names, model)
    out_dir = Path(out_dir)
    check_out_folder(out_dir)
    png_of = dict(zip(files, (out_dir / name for name in overlay_names(files, method)), strict=True))
    with claim_output_folder(out_dir):  # one explain at a time per folder: two would lose one maps.npz
        check_outputs([*png_of.values(), out_dir / MAPS_FILE], force=force)
        names = list(class_names or info.get("class_names") or [])
        return _write_explanations(
            model, info, files, out_dir, png_of, method, target_class, batch_size, names, on_error
        )


def _write_explanations(
    model: torch.nn.Module,
    info: dict[str, Any],
    files: Sequence[Path],
    out_dir: Path,
    png_of: dict[Path, Path],
    method: str,
    target_class: int | None,
    batch_size: int,
    names: Sequence[str],
    on_error: Any,
) -> list[Path]:
    """:func:`explain_files` once its folder is claimed and checked: the overlays of the readable images, then
    ``maps.npz``."""
    files, pixels = _read_images(files, info, on_error)
    pngs = [png_of[f] for f in files]
    maps, targets, scores, conservation = [], [], [], []
    for start in _progress(range(0, len(files), batch_size), "explaining"):
        batch = normalise(torch.stack(pixels[start : start + batch_size]), info)
        e = explain(model, batch, method=method, target=target_class)
        maps.append(e.maps)
        targets.append(e.target)
        scores.append(e.score)
        if e.conservation is not None:
            conservation.append(e.conservation)
    maps_t, target_t = torch.cat(maps), torch.cat(targets)
    out_dir.mkdir(parents=True, exist_ok=True)
    for i, png in enumerate(pngs):
        label = names[target_t[i]] if target_t[i] < len(names) else str(int(target_t[i]))
        fig = overlay_grid(pixels[i][None].float() / 255, {method: maps_t[i : i + 1]}, [f"class {label}"])
        save_figure(fig, png, dpi=150)
    buffer = io.BytesIO()
    np.savez(
        buffer,
        maps=maps_t.double().numpy(),
        target=target_t.numpy(),
        score=torch.cat(scores).double().numpy(),
        conservation=torch.cat(conservation).double().numpy() if conservation else np.array([]),
        files=np.array([str(f) for f in files]),
        method=np.array(method),
    )
    write_output(out_dir / MAPS_FILE, buffer.getvalue(), force=True)
    return [*pngs, out_dir / MAPS_FILE]


def _test_images(target: str | Path, count: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
    loaded = load_evaluation_target(target)
    dm = loaded.datamodule
    dm.setup()
    images, labels = [], []
    for x, y in dm.test_dataloader():
        images.append(x)
        labels.append(y)
        if sum(len(b) for b in images) >= count:
            break
    return loaded, torch.cat(images)[:count], torch.cat(labels)[:count]


def evaluation_table(results: dict[str, Any]) -> str:
    """The methods of one run as a Markdown table (means over the images), the refused ones below it."""
    lines = [
        f"**{results['model']}** ({results['kind']}), {results['images']} test images, patch {results['patch']}",
        "",
        "| method | deletion AUC (random) | insertion AUC (random) | rank corr. vs randomised | conservation | "
        "s / image |",
        "|---|---|---|---|---|---|",
    ]
    for method, r in results["methods"].items():
        s = r["summary"]
        conservation = f"{s['conservation']:.1e}" if "conservation" in s else "-"
        lines.append(
            f"| {TITLES.get(method, method)} | {s['deletion_auc']:.3f} ({s['random_deletion_auc']:.3f}) | "
            f"{s['insertion_auc']:.3f} ({s['random_insertion_auc']:.3f}) | {s['randomisation_spearman']:.2f} | "
            f"{conservation} | {s['seconds_per_image']:.3f} |"
        )
    if results["refused"]:
        lines.append("")
    lines += [f"- {method} refused: {reason}" for method, reason in results["refused"].items()]
    return "\n".join(lines) + "\n"


def evaluate_run(
    target: str | Path,
    *,
    images: int = 32,
    methods: Sequence[str] | None = None,
    out_dir: str | Path | None = None,
    steps: int = 16,
    seed: int = 0,
    force: bool = False,
    class_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """``vitlab explain RUN --evaluate``: the applicable overview methods (or ``methods``) on the first ``images``
    test images; writes the JSON (per-image values, command, revision, CPU, load average), the table, the
    faithfulness figure and an overlay figure of eight images under ``out_dir`` (default ``<run>/explain``)."""
    loaded, x, labels = _test_images(target, images)
    model = loaded.model.eval()
    _check_names(class_names, model)
    out = Path(out_dir) if out_dir is not None else loaded.out_dir.parent / EXPLAIN_DIR
    check_out_folder(out)
    files = [out / name for name in (EVALUATION_JSON, EVALUATION_TABLE, EVALUATION_FIGURE, OVERLAY_FIGURE)]
    explainer = explainer_on(model, x[:1], methods or OVERVIEW_METHODS)  # the rules' refusals, before any work
    for method in methods or ():
        explainer.check(method)
    with claim_output_folder(out):  # one explain at a time per folder
        check_outputs(files, force=force)
        patch = int(getattr(model, "init_kwargs", {}).get("patch_size", 4))
        patch = patch if x.shape[-1] // patch >= 4 else max(1, x.shape[-1] // 8)
        load_before = os.getloadavg()
        results = evaluate_methods(model, x, methods, explainer, patch=patch, steps=steps, seed=seed)
        results.update(
            model=getattr(model, "preset", type(model).__name__),
            source=str(loaded.source),
            run_model=loaded.run_model,
            images=int(x.shape[0]),
            patch=patch,
            steps=steps,
            seed=seed,
            labels=labels.tolist(),
            load_average={"before": list(load_before), "after": list(os.getloadavg())},
            environment=environment(),
            lscpu=_lscpu(),
            test_metrics=_test_metrics(target),
        )
        write_output(files[0], strict_dumps(results, indent=1) + "\n", force=True)
        write_output(files[1], evaluation_table(results), force=True)
        save_figure(faithfulness_figure(results, f"{results['model']} ({results['kind']})"), files[2], dpi=150)
        names = list(class_names or getattr(loaded.datamodule, "class_names", None) or [])
        figure = overlay_figure(model, x[:8], labels[:8], loaded.mean, loaded.std, names)
        save_figure(figure, files[3], dpi=150)
    return results


def overlay_figure(
    model: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor, mean, std, class_names: Sequence[str] = ()
):
    """The applicable overview methods side by side on ``x`` (normalised), each explaining the predicted class; rows are
    captioned ``label -> prediction``."""
    applicable = explainer_on(model, x[:1], OVERVIEW_METHODS).applicable(OVERVIEW_METHODS)
    explanations = {m: explain(model, x, method=m) for m in applicable}
    predicted = next(iter(explanations.values())).target

    def name(index: int) -> str:
        return class_names[index] if index < len(class_names) else str(index)

    captions = [f"{name(int(y))} -> {name(int(p))}" for y, p in zip(labels, predicted, strict=True)]
    maps = {m: e.maps for m, e in explanations.items()}
    return overlay_grid(denormalize(x, mean, std), maps, captions)
