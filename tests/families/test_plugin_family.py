"""A family is one package: the toy MLP-Mixer of tests/plugins, installed through a distribution's entry point
(``vitlab.families``), trains, evaluates and exports from the command line with no edit under src/vitlab, and the
config check stays as strict with it as without it."""

import subprocess
import sys

import pytest

from data_fixtures import write_imagefolder
from plugin_fixtures import toy_mixer_env

VITLAB = [sys.executable, "-m", "vitlab.cli.main"]


@pytest.fixture
def plugin_env(tmp_path):
    """The environment of a Python whose site holds a distribution that declares the toy family's entry point."""
    return toy_mixer_env(tmp_path)


def _vitlab(env, *args, cwd):
    return subprocess.run([*VITLAB, *args], capture_output=True, text=True, env=env, cwd=cwd)


@pytest.mark.slow
def test_a_plugin_family_fits_evaluates_and_exports_from_the_command_line(plugin_env, tmp_path):
    write_imagefolder(tmp_path / "data", {"": 10}, classes=("a", "b"), size=(8, 8), gray=True)
    run = tmp_path / "run"
    fit = _vitlab(
        plugin_env,
        "fit",
        "model.name=toy_mixer_pico",
        "loss.logit_penalty=0.01",
        "data.name=imagefolder",
        f"data.path={tmp_path / 'data'}",
        "data.in_chans=1",
        "data.batch_size=4",
        "trainer.max_epochs=1",
        "trainer.accelerator=cpu",
        f"run.dir={run}",
        cwd=tmp_path,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    assert (run / "export" / "model.safetensors").is_file() and (run / "test_metrics.json").is_file()

    evaluate = _vitlab(plugin_env, "evaluate", str(run), "--no-corruptions", cwd=tmp_path)
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    assert (run / "evaluation" / "evaluation.json").is_file()

    export = _vitlab(plugin_env, "export", str(run), "--out", str(tmp_path / "exported"), cwd=tmp_path)
    assert export.returncode == 0, export.stderr[-3000:]
    assert (tmp_path / "exported" / "config.json").is_file()

    # a family that declares no explainer gets the generic one (vitlab.explain.hilrp: rules by operation type): LRP
    # explains the mixer by construction; a method that needs declared attention is refused in one line
    explain = _vitlab(
        plugin_env, "explain", str(run), "--evaluate", "--num-images", "2", "--methods", "lrp", cwd=tmp_path
    )
    assert explain.returncode == 0, explain.stderr[-3000:]
    assert (run / "explain" / "explain_evaluation.json").is_file()
    refused = _vitlab(
        plugin_env,
        "explain",
        str(run),
        "--evaluate",
        "--num-images",
        "2",
        "--methods",
        "attention",
        "--force",
        cwd=tmp_path,
    )
    assert refused.returncode == 2, (refused.stdout + refused.stderr)[-3000:]
    assert "declares no CLS-token attention" in refused.stderr.splitlines()[0], refused.stderr


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.name=toy_mixer_pic", "unknown model 'toy_mixer_pic'. Did you mean toy_mixer_pico"),
        ("model.dimm=8", "model 'toy_mixer_pico' (ToyMixer) has no option 'dimm'. Did you mean dim?"),
        ("loss.logit_penalti=1", "unknown config key 'loss.logit_penalti'"),
        ("loss.lambda_ei=0.9", "loss.lambda_ei"),
    ],
)
def test_the_config_check_stays_strict_with_a_plugin_family(plugin_env, tmp_path, override, message):
    out = _vitlab(plugin_env, "fit", "model.name=toy_mixer_pico", override, f"run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "run").exists()


def test_list_models_lists_the_plugin_familys_presets_without_torch(plugin_env, tmp_path):
    code = (
        "import sys; from vitlab.cli.main import main; main(['list-models', 'toy_mixer_*']); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=plugin_env, cwd=tmp_path)
    assert out.stdout.splitlines() == [
        f"{'toy_mixer_pico':24s} toy MLP-Mixer, width 16, depth 2 (8x8 one-channel images)",
        "False",
    ]
