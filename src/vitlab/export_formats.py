"""Deployment formats of an exported model, beside ``model.safetensors`` + ``config.json``: ONNX and ``torch.export``.

Both hold the classifier graph, ``images [B, C, H, W] (normalised) -> logits [B, num_classes]``: the timm contract
``forward_head(forward_features(x))`` that every vitlab family follows (ViTCAE: the classifier on ``mu_cls``, without
the decoder). The batch axis is dynamic. ``model.onnx`` is written by ``torch.onnx.export(dynamo=True)`` and checked
against onnxruntime on a batch of another size before it is kept; ``model.pt2`` is a ``torch.export`` program
(``torch.export.load(path).module()(x)``), checked against the eager model the same way.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from vitlab.atomic import staged_file
from vitlab.errors import VitlabError
from vitlab.progress import stage
from vitlab.rundir import EXPORT_FORMAT_FILES

FORMATS = ("safetensors", "onnx", "torch-export")
FILE_NAMES = EXPORT_FORMAT_FILES
#: the example batch the graph is traced with, and the other batch size it is checked on
EXPORT_BATCH, CHECK_BATCH = 2, 3
TOLERANCE = 1e-4


class ExportFormatError(VitlabError, RuntimeError):
    """A model that cannot be written in a deployment format, or whose written graph disagrees with it."""


class ClassifierGraph(nn.Module):
    """``images -> logits`` of any vitlab classifier (``forward_head(forward_features(x))``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        m = self.model
        if hasattr(m, "forward_features") and hasattr(m, "forward_head"):
            return m.forward_head(m.forward_features(images))
        out = m(images)
        return out if isinstance(out, torch.Tensor) else out.logits


def example_input(model: nn.Module, batch: int = EXPORT_BATCH) -> torch.Tensor:
    """A random batch ``[batch, in_chans, img_size, img_size]`` for the geometry in ``model.init_kwargs``."""
    kwargs = getattr(model, "init_kwargs", {})
    if "img_size" not in kwargs:
        raise ExportFormatError(f"{type(model).__name__} records no img_size; build it with vitlab.create_model")
    size = kwargs["img_size"]
    return torch.randn(batch, kwargs.get("in_chans", 3), size, size, generator=torch.Generator().manual_seed(0))


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


def _staged(path: Path) -> contextlib.AbstractContextManager[Path]:
    """A temporary file beside ``path`` that becomes ``path`` only when the block succeeds (checks included)."""
    return staged_file(path, suffix=path.suffix)


@contextlib.contextmanager
def _capturing(model: nn.Module, fmt: str) -> Iterator[None]:
    """torch.onnx prints progress lines and warns about its own internals (neither is the user's business); a
    failure to capture the graph becomes an :class:`ExportFormatError` that says why."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            yield
        except ExportFormatError:
            raise
        except Exception as e:  # torch.export / onnxscript raise many types
            raise _cannot(model, fmt, e) from e


def export_onnx(model: nn.Module, path: str | Path, opset: int | None = None) -> tuple[Path, float]:
    """Write ``model``'s classifier graph to ``path`` as ONNX (input ``images``, output ``logits``, dynamic batch)
    and check it with onnxruntime (:func:`check_onnx`); the file appears only once it passed. Returns the path and
    the max |onnxruntime - model| of the check."""
    path = Path(path)
    stage(f"vitlab export: tracing the ONNX graph of {_family(model)}")
    graph, x, dims = _trace(model)
    with _staged(path) as tmp:
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
        stage(f"vitlab export: checking the ONNX graph with onnxruntime on a batch of {CHECK_BATCH}")
        diff = check_onnx(tmp, model)
    return path, diff


def check_onnx(path: str | Path, model: nn.Module, batch: int = CHECK_BATCH, atol: float = TOLERANCE) -> float:
    """Max |onnxruntime - eager| of the logits on a random batch of ``batch`` images; an error above ``atol``."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise ExportFormatError("--format onnx needs onnx and onnxruntime: pip install 'vitlab[onnx]'") from e
    x = example_input(model, batch)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(["logits"], {"images": x.numpy()})[0])
    with torch.no_grad():
        want = ClassifierGraph(model).eval()(x)
    return _check(model, "ONNX (onnxruntime)", got, want, atol)


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


def export_program(model: nn.Module, path: str | Path) -> tuple[Path, float]:
    """Write ``model``'s classifier graph as a ``torch.export`` program (``.pt2``, dynamic batch), checked against
    the eager model on a batch of another size. Returns the path and the max difference of the check."""
    path = Path(path)
    stage(f"vitlab export: tracing the torch.export program of {_family(model)}")
    graph, x, dims = _trace(model)
    with _staged(path) as tmp:
        with _capturing(model, "torch-export"):
            torch.export.save(torch.export.export(graph, (x,), dynamic_shapes=(dims,)), str(tmp))
        stage(f"vitlab export: checking the program on a batch of {CHECK_BATCH}")
        check = example_input(model, CHECK_BATCH)
        with torch.no_grad():
            got = torch.export.load(str(tmp)).module()(check)
            want = graph(check)
        diff = _check(model, "torch.export", got, want, TOLERANCE)
    return path, diff


def write_format(model: nn.Module, out_dir: str | Path, fmt: str) -> tuple[Path, float] | None:
    """Add ``fmt``'s file to the export folder ``out_dir`` (nothing for ``safetensors``, which is always written).
    Returns the file and the max |file's logits - model's| on a batch of ``CHECK_BATCH``."""
    if fmt not in FORMATS:
        raise ExportFormatError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt == "safetensors":
        return None
    model = model.eval()
    target = Path(out_dir) / FILE_NAMES[fmt]
    return export_onnx(model, target) if fmt == "onnx" else export_program(model, target)
