"""benchmarks/experiments/npz_transport.py: the images a protocol reads carried losslessly, and refused when damaged."""

import json

import numpy as np
import pytest

from benchmarks.experiments import npz_transport


@pytest.fixture
def npz(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "data.npz"
    np.savez(
        path,
        x_train=rng.integers(0, 256, (120, 8, 8, 3), dtype=np.uint8),
        y_train=np.arange(120) % 4,
        x_test=rng.integers(0, 256, (30, 8, 8, 3), dtype=np.uint8),
        y_test=np.arange(30) % 4,
    )
    return path


def test_the_used_images_and_every_label_come_back_bit_for_bit_and_the_rest_are_zeros(npz, tmp_path, monkeypatch):
    used = np.array([0, 3, 7, 50, 119])
    monkeypatch.setattr(npz_transport, "used_train_indices", lambda *a: used)
    npz_transport.pack(npz, tmp_path / "pack", "any", [0], all_train=False, workers=1)
    npz_transport.unpack(tmp_path / "pack", tmp_path / "back.npz")
    with np.load(npz) as a, np.load(tmp_path / "back.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        np.testing.assert_array_equal(a["x_train"][used], b["x_train"][used])
        assert not np.delete(b["x_train"], used, axis=0).any()
        for key in ("x_test", "y_train", "y_test"):
            np.testing.assert_array_equal(a[key], b[key])
            assert a[key].dtype == b[key].dtype


def test_a_damaged_copy_is_refused_and_nothing_is_written(npz, tmp_path):
    npz_transport.pack(npz, tmp_path / "pack", "any", [0], all_train=True, workers=1)
    manifest = json.loads((tmp_path / "pack" / "manifest.json").read_text())
    manifest["sha256"]["x_test"] = "0" * 64
    (tmp_path / "pack" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="x_test does not hash"):
        npz_transport.unpack(tmp_path / "pack", tmp_path / "back.npz")
    assert not list(tmp_path.glob("back*"))


def test_an_existing_output_is_never_overwritten(npz, tmp_path):
    npz_transport.pack(npz, tmp_path / "pack", "any", [0], all_train=True, workers=1)
    (tmp_path / "back.npz").write_text("mine")
    with pytest.raises(SystemExit, match="exists"):
        npz_transport.unpack(tmp_path / "pack", tmp_path / "back.npz")
    assert (tmp_path / "back.npz").read_text() == "mine"


def test_parts_carried_apart_join_into_the_whole_and_a_missing_or_foreign_part_is_refused(npz, tmp_path):
    npz_transport.pack(npz, tmp_path / "pack", "any", [0], all_train=True, workers=1, parts=2)
    first, second = tmp_path / "pack" / "part1", tmp_path / "pack" / "part2"
    npz_transport.unpack([second, first], tmp_path / "back.npz")  # in any order
    with np.load(npz) as a, np.load(tmp_path / "back.npz") as b:
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key])
    with pytest.raises(SystemExit, match="each of its 2 parts once"):
        npz_transport.unpack([first], tmp_path / "half.npz")
    with pytest.raises(SystemExit, match="each of its 2 parts once"):
        npz_transport.unpack([first, first], tmp_path / "twice.npz")
    other = tmp_path / "other.npz"
    with np.load(npz) as a:
        np.savez(other, **{k: (a[k] + 1 if k == "x_test" else a[k]) for k in a.files})
    npz_transport.pack(other, tmp_path / "pack2", "any", [0], all_train=True, workers=1, parts=2)
    with pytest.raises(SystemExit, match="each of its 2 parts once"):
        npz_transport.unpack([first, tmp_path / "pack2" / "part2"], tmp_path / "mixed.npz")
    assert not list(tmp_path.glob("half*")) + list(tmp_path.glob("twice*")) + list(tmp_path.glob("mixed*"))
