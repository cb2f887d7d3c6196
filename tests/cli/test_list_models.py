"""`vitlab list-models` reads the torch-free catalogue: torch, Lightning and timm are never imported."""

from process_fixtures import vitlab_process


def test_list_models_runs_without_torch(tmp_path):
    out, loaded = vitlab_process(["list-models"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("vit_nano ") for line in lines) and any(line.startswith("swin_pico ") for line in lines)
    assert loaded == []
