"""Deployment formats of an exported model, beside ``model.safetensors`` + ``config.json``: ONNX and ``torch.export``.

Both hold the classifier graph, ``images [B, C, H, W] (normalised) -> logits [B, num_classes]``: the model's own
forward, what ``vitlab predict`` computes (ViTCAE: its classifier on ``mu_cls``, ``forward_head(forward_features(x))``,
without the decoder). The batch axis is dynamic. ``model.onnx`` is written by ``torch.onnx.export(dynamo=True)`` and
checked against onnxruntime before it is kept; ``model.pt2`` is a ``torch.export`` program
(``torch.export.load(path).module()(x)``), checked the same way. The check compares the file with the model's
forward on a batch of another size than the traced one that reaches the paths real images reach (:func:`check_inputs`):
random noise alone misses some (CET-ViT's empty slots).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from vitlab.atomic import staged_file
from vitlab.errors import MissingLibraryError, VitlabError
from vitlab.models.protocols import GenerativeModel
from vitlab.progress import stage
from vitlab.rundir import EXPORT_FORMAT_FILES

FORMATS = ("safetensors", "onnx", "torch-export")
#: the example batch the graph is traced with
EXPORT_BATCH = 2
TOLERANCE = 1e-4
#: the libraries each format needs beyond torch, with the line that installs them
LIBRARIES = {"onnx": (("onnx", "onnxscript", "onnxruntime"), "pip install 'vitlab[onnx]'")}


class ExportFormatError(VitlabError, RuntimeError):
    """A model that cannot be written in a deployment format, or whose written graph disagrees with it."""


def model_logits(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """``model(images)``'s logits ``[B, num_classes]``: the tensor, or the ``.logits`` of a richer output (ViTCAE)."""
    out = model(images)
    return out if isinstance(out, torch.Tensor) else out.logits


class ClassifierGraph(nn.Module):
    """``images -> logits`` of any vitlab classifier: its forward (:func:`model_logits`), which is not always
    ``forward_head(forward_features(x))``: CET-ViT's head averages the occupied slots only (``mask_empty_slots``),
    which its forward knows and ``forward_features`` does not return. A generative model (ViTCAE) gives its
    classifier alone, ``forward_head(forward_features(x))``, without the decoder its forward also runs."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        m = self.model
        if isinstance(m, GenerativeModel):
            return m.forward_head(m.forward_features(images))
        return model_logits(m, images)


def _geometry(model: nn.Module) -> tuple[int, int]:
    kwargs = getattr(model, "init_kwargs", {})
    if "img_size" not in kwargs:
        raise ExportFormatError(f"{type(model).__name__} records no img_size; build it with vitlab.create_model")
    return kwargs.get("in_chans", 3), kwargs["img_size"]


def example_input(model: nn.Module, batch: int = EXPORT_BATCH) -> torch.Tensor:
    """A random batch ``[batch, in_chans, img_size, img_size]`` for the geometry in ``model.init_kwargs``."""
    chans, size = _geometry(model)
    return torch.randn(batch, chans, size, size, generator=torch.Generator().manual_seed(0))


def check_inputs(model: nn.Module, images: torch.Tensor | None = None) -> torch.Tensor:
    """The batch an exported graph is checked on, ``[B, C, H, W]`` (normalised), ``B`` never the traced batch.

    ``images``: a batch of the run's own validation data, when the run is at hand (:func:`validation_images`).
    After them, inputs built to reach the paths that random noise misses: images of one colour and images of a few
    large blocks (many patches alike: tied scores, and in CET-ViT slots that no token picks, which its head leaves
    out), an image half blank, and N(0, 1) noise.
    """
    chans, size = _geometry(model)
    gen = torch.Generator().manual_seed(0)
    noise = torch.randn(3, chans, size, size, generator=gen)
    flat = torch.tensor([0.0, 2.0, -2.0]).view(3, 1, 1, 1).expand(3, chans, size, size)
    blocks = torch.randn(2, chans, 2, 2, generator=gen).repeat_interleave(-(-size // 2), -1)
    blocks = 2 * blocks.repeat_interleave(-(-size // 2), -2)[..., :size, :size]
    half = noise[:1].clone()
    half[..., : size // 2] = 0.0
    built = torch.cat([flat, blocks, half, noise])
    return built if images is None else torch.cat([images.to(built.dtype), built])


def validation_images(model: nn.Module, data: dict, info: dict, count: int = 128) -> torch.Tensor | None:
    """The first ``count`` validation images of a run's data (its ``config.data``), normalised as in training with
    ``info``'s mean and std; None when the data is not at hand (moved, another machine) or does not fit ``model``."""
    from vitlab.config import DataConfig, from_dict
    from vitlab.data import build_datamodule

    if not data:
        return None
    try:
        datamodule = build_datamodule(from_dict(DataConfig, {**data, "num_workers": 0}, "data"))
        if info.get("mean") and info.get("std"):
            datamodule.set_normalisation(info["mean"], info["std"])
        images, _ = next(iter(datamodule.val_dataloader()))
    except (VitlabError, OSError, ValueError, StopIteration):
        return None
    return images[:count] if images.shape[1:] == example_input(model, 1).shape[1:] else None


def require_libraries(fmt: str) -> None:
    """A :class:`~vitlab.errors.MissingLibraryError` with the install line when a library ``fmt`` needs is not
    installed, before anything is written (the exporter would report it as a graph it cannot capture)."""
    names, install = LIBRARIES.get(fmt, ((), ""))
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingLibraryError(
            f"--format {fmt} needs {', '.join(names[:-1])} and {names[-1]}; {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {install}"
        )


def _family(model: nn.Module) -> str:
    return f"{getattr(model, 'preset', '?')} ({type(model).__name__})"


def _cannot(model: nn.Module, fmt: str, e: Exception) -> ExportFormatError:
    lines = [line for line in str(e).splitlines() if line.strip()]
    reason = lines[0][:300] if lines else type(e).__name__
    return ExportFormatError(
        f"{_family(model)} cannot be written as {fmt}: torch.export could not capture its forward pass as one graph "
        f"with a dynamic batch ({type(e).__name__}: {reason}); the safetensors export is unaffected"
    )


def _trace(model: nn.Module) -> tuple[ClassifierGraph, torch.Tensor, dict[int, object]]:
    graph = ClassifierGraph(model).eval()
    batch = torch.export.Dim("batch", min=1, max=65536)
    return graph, example_input(model), {0: batch}


@contextlib.contextmanager
def _capturing(model: nn.Module, fmt: str) -> Iterator[None]:
    """torch.onnx prints progress lines and warns about its own internals (neither is the user's business); a
    failure to capture the graph becomes an :class:`ExportFormatError` that says why."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            yield
        except VitlabError:
            raise
        except ImportError as e:  # a library the exporter loads lazily: not the model's fault
            install = LIBRARIES.get(fmt.lower(), ((), f"pip install {e.name}"))[1]
            raise MissingLibraryError(
                f"--format {fmt.lower()} needs {e.name}, which is not installed: {install}"
            ) from e
        except Exception as e:  # torch.export / onnxscript raise many types
            raise _cannot(model, fmt, e) from e


def export_onnx(
    model: nn.Module, path: str | Path, opset: int | None = None, images: torch.Tensor | None = None
) -> tuple[Path, float]:
    """Write ``model``'s classifier graph to ``path`` as ONNX (input ``images``, output ``logits``, dynamic batch)
    and check it with onnxruntime (:func:`check_onnx`, on ``images`` and the built inputs of :func:`check_inputs`);
    the file appears only once it passed. Returns the path and the max |onnxruntime - model| of the check."""
    require_libraries("onnx")
    path = Path(path)
    stage(f"vitlab export: tracing the ONNX graph of {_family(model)}")
    graph, x, dims = _trace(model)
    with staged_file(path, suffix=path.suffix) as tmp:  # kept only once it passed the check
        with _capturing(model, "ONNX"):
            torch.onnx.export(
                graph,
                (x,),
                str(tmp),
                dynamo=True,
                input_names=["images"],
                output_names=["logits"],
                dynamic_shapes=(dims,),
                opset_version=opset,
                external_data=False,
                verbose=False,
            )
        stage("vitlab export: checking the ONNX graph with onnxruntime")
        diff = check_onnx(tmp, model, check_inputs(model, images))
    return path, diff


def check_onnx(path: str | Path, model: nn.Module, images: torch.Tensor, atol: float = TOLERANCE) -> float:
    """Max |onnxruntime - the model's forward| of the logits on ``images``; an error above ``atol``."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(["logits"], {"images": images.numpy()})[0])
    return _check(model, "ONNX (onnxruntime)", got, _reference(model, images), atol)


def _reference(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The logits the file must give: the model's own forward in eager torch (``vitlab evaluate``'s), computed
    apart from the traced :class:`ClassifierGraph`, so that a graph that is not the forward is caught."""
    with torch.no_grad():
        return model_logits(model.eval(), images)


def _check(model: nn.Module, what: str, got: torch.Tensor, want: torch.Tensor, atol: float) -> float:
    if got.shape != want.shape:
        raise ExportFormatError(
            f"the {what} graph of {_family(model)} gives logits {list(got.shape)}, not {list(want.shape)}"
        )
    diff = float((got - want).abs().max())
    if not diff <= atol:
        raise ExportFormatError(
            f"the {what} graph of {_family(model)} differs from the model by {diff:.2e} (> {atol:.0e}) on a batch "
            f"of {len(got)}; the file was not kept"
        )
    return diff


def export_program(model: nn.Module, path: str | Path, images: torch.Tensor | None = None) -> tuple[Path, float]:
    """Write ``model``'s classifier graph as a ``torch.export`` program (``.pt2``, dynamic batch), checked against
    the model on ``images`` and the built inputs of :func:`check_inputs`. Returns the path and the max difference
    of the check."""
    path = Path(path)
    stage(f"vitlab export: tracing the torch.export program of {_family(model)}")
    graph, x, dims = _trace(model)
    with staged_file(path, suffix=path.suffix) as tmp:  # kept only once it passed the check
        with _capturing(model, "torch-export"):
            torch.export.save(torch.export.export(graph, (x,), dynamic_shapes=(dims,)), str(tmp))
        stage("vitlab export: checking the program")
        check = check_inputs(model, images)
        with torch.no_grad():
            got = torch.export.load(str(tmp)).module()(check)
        diff = _check(model, "torch.export", got, _reference(model, check), TOLERANCE)
    return path, diff


def write_format(
    model: nn.Module, out_dir: str | Path, fmt: str, images: torch.Tensor | None = None
) -> tuple[Path, float] | None:
    """Add ``fmt``'s file to the export folder ``out_dir`` (nothing for ``safetensors``, which is always written).
    ``images``: a batch of the run's validation data to check the file on, besides the built inputs. Returns the
    file and the max |file's logits - model's| of the check."""
    if fmt not in FORMATS:
        raise ExportFormatError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt == "safetensors":
        return None
    model = model.eval()
    target = Path(out_dir) / EXPORT_FORMAT_FILES[fmt]
    return export_onnx(model, target, images=images) if fmt == "onnx" else export_program(model, target, images)
