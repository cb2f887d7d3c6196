"""Exported models and checkpoints: the public names, the weights' checksums, the device check, a folder that
cannot be written."""

import errno
import json
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

import vitlab
import vitlab.export
from run_fixtures import make_run, write_checkpoint
from tests.model_fixtures import tiny_vit
from vitlab.cli.main import main
from vitlab.errors import CheckpointError, ConfigError
from vitlab.export import checksum_file, export_model, file_sha256, load_model, read_checkpoint


def test_export_model_is_a_top_level_name():
    assert vitlab.export_model is vitlab.export.export_model
    assert "export_model" in vitlab.__all__ and "export_model" in dir(vitlab)


def _flip_a_tensor_byte(path, tensor_bytes=None):
    """Flip one byte of a tensor's data (the file's last tensor, or where ``tensor_bytes`` are): the header and the
    archive stay valid, so safetensors and ``torch.load`` read the file."""
    data = bytearray(path.read_bytes())
    data[data.find(tensor_bytes) if tensor_bytes else -3] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupted_export_is_refused_by_its_checksum(tmp_path):
    out = export_model(tiny_vit().eval(), tmp_path / "export")
    _flip_a_tensor_byte(out / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model.safetensors is corrupt \(checksum mismatch\): export the model"):
        load_model(out)


def test_an_export_without_a_checksum_still_loads(tmp_path):
    model = tiny_vit().eval()
    out = export_model(model, tmp_path / "export")
    meta = json.loads((out / "config.json").read_text())
    assert len(meta.pop("weights_sha256")) == 64
    (out / "config.json").write_text(json.dumps(meta))  # as an export written before the checksum
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(load_model(out)(x), model(x))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_says_so(tmp_path):
    out = export_model(tiny_vit().eval(), tmp_path / "export")
    with pytest.raises(ConfigError, match=r"^CUDA is not available on this machine; use --device cpu$"):
        load_model(out, map_location="cuda")


def test_a_corrupted_checkpoint_is_refused_by_its_sidecar_checksum(tmp_path):
    from vitlab.training.callbacks import AtomicCheckpointIO

    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir()
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {"model.w": torch.arange(1000.0)}}, ckpt)
    assert checksum_file(ckpt).read_text().split() == [file_sha256(ckpt), "last.ckpt"]  # `sha256sum -c` reads it
    assert read_checkpoint(ckpt)["state_dict"]["model.w"][500] == 500
    _flip_a_tensor_byte(ckpt, torch.arange(1000.0)[500:502].numpy().tobytes())
    with pytest.raises(CheckpointError, match=r"last.ckpt is corrupt \(checksum mismatch with last.ckpt.sha256\)"):
        read_checkpoint(ckpt)
    checksum_file(ckpt).unlink()  # a checkpoint without a sidecar (written before them) is read as it is
    assert read_checkpoint(ckpt)["state_dict"]["model.w"][500] != 500
    io.save_checkpoint({"state_dict": {}}, ckpt)
    io.remove_checkpoint(ckpt)
    assert list(ckpt.parent.iterdir()) == []


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            SafetensorError(
                'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space" })'
            ),
            "the disk is full",
        ),
        (OSError(errno.EROFS, "Read-only file system"), "the file system is read-only"),
    ],
    ids=["full-disk", "read-only"],
)
def test_an_export_that_cannot_be_written_is_one_line_naming_the_folder(tmp_path, monkeypatch, capsys, error, expected):
    run = make_run(tmp_path)
    write_checkpoint(run)

    def fail(model, path):
        Path(path).write_bytes(b"half")  # what a full disk leaves: a part of the file
        raise error

    monkeypatch.setattr(vitlab.export, "st_save_model", fail)
    out = tmp_path / "deploy"
    assert main(["export", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[
        0
    ] == f"vitlab export: error: cannot write {out}: {expected} (no file is left half-written)" + (
        "; free space, or write elsewhere" if "full" in expected else "; write elsewhere"
    )
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["vit_pico-0"], "no staging folder left"
