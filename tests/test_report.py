"""The HTML run report: sections present for what a run has and absent for what it lacks, images embedded as PNG
data URIs, text escaped, no external URLs; comparison pages; the command; the pure pieces against hand-worked cases."""

import base64
import io
import json
import re
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import torch

import run_fixtures
from vitlab.cli.main import main
from vitlab.config import RunConfig, RunSection
from vitlab.errors import ConfigError
from vitlab.report import REPORT_FILE, write_report
from vitlab.report.html import better_direction, cls_attention_maps, config_differences, curve_panels

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EPOCHS = 3


def make_run(
    root: Path, name: str = "vit-run", *, preset: str = "vit_pico", seed: int = 0, generate: bool = True
) -> Path:
    """The shared run fixture (:func:`run_fixtures.make_run`) with what a report shows: the environment, a few
    epochs of metrics, test metrics and (``generate``) a ViTCAE-style generate/ folder."""
    return run_fixtures.make_run(
        root,
        name,
        preset=preset,
        seed=seed,
        env=True,
        epochs=EPOCHS,
        test_metrics={"test/acc": 0.5 + 0.1 * seed, "test/loss": 1.5 - 0.1 * seed},
        generate={"reconstruction/psnr": 21.5} if generate else None,
    )


def dynamics_records(epochs: int = 3, layers: int = 2, heads: int = 2) -> list[dict]:
    """``dynamics.jsonl`` records in the controller's format (epoch 0 has no drift); head (0, 0) freezes at epoch 2."""
    records = []
    for epoch in range(epochs):
        frozen = [[epoch >= 2 and (layer, head) == (0, 0) for head in range(heads)] for layer in range(layers)]
        drift = (
            None
            if epoch == 0
            else [[0.1 * (layer + head + 1) / epoch for head in range(heads)] for layer in range(layers)]
        )
        records.append(
            {
                "epoch": epoch,
                "mode": "schedule",
                "modules": [f"blocks.{layer}.attn" for layer in range(layers)],
                "drift": drift,
                "kappa": [[1.0 + head for head in range(heads)] for _ in range(layers)],
                "tau": [[1.0 / (1 + 0.1 * epoch) for _ in range(heads)] for _ in range(layers)],
                "converged": frozen,
                "frozen": frozen,
                "non_converged": layers * heads - int(np.sum(frozen)),
                "mean_drift": None if drift is None else float(np.mean(drift)),
            }
        )
    return records


def sections(document: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)"', document)


def section_html(document: str, section_id: str) -> str:
    match = re.search(rf'<section id="{section_id}">(.*?)</section>', document, re.S)
    assert match, f"no section {section_id}"
    return match.group(1)


def image_sources(document: str) -> list[str]:
    return re.findall(r'<img\b[^>]*\bsrc="([^"]*)"', document)


def decode_png(uri: str) -> np.ndarray:
    prefix = "data:image/png;base64,"
    assert uri.startswith(prefix), uri[:40]
    data = base64.b64decode(uri[len(prefix) :], validate=True)
    assert data.startswith(PNG_SIGNATURE)
    return matplotlib.image.imread(io.BytesIO(data), format="png")


@pytest.fixture(scope="module")
def basic_report(tmp_path_factory) -> tuple[Path, str]:
    run = make_run(tmp_path_factory.mktemp("report"))
    path = write_report([run])
    return path, path.read_text()


# -------------------------------------------------------------------------------------------------------------------
def test_report_of_one_run_has_the_sections_the_run_has(basic_report):
    path, document = basic_report
    assert path.name == REPORT_FILE and path.parent.name == "vit-run"
    assert sections(document) == ["config", "curves", "test", "generate", "attention"]
    for absent in ("evaluation", "dynamics", "segments", "other"):
        assert f'id="{absent}"' not in document and f'href="#{absent}"' not in document
    assert "<details><summary>Resolved config (config.yaml)</summary>" in document
    config = section_html(document, "config")
    assert "name: vit-run" in config
    assert "<details><summary>Environment (env.json)</summary>" in config and f"torch {torch.__version__}" in config
    test = section_html(document, "test")
    assert "test/acc" in test and ">0.5<" in test
    assert "reconstruction/psnr" in section_html(document, "generate")
    assert "conditional_samples" not in document  # grids the run does not have are not announced either


def test_every_image_is_an_embedded_png_and_nothing_is_fetched(basic_report):
    _, document = basic_report
    sources = image_sources(document)
    assert len(sources) == 3  # curves, the reconstruction grid, the attention maps
    for uri in sources:
        image = decode_png(uri)
        assert image.shape[0] > 0 and image.shape[1] > 0
    assert not re.search(r"(?:src|href)=\"(?!#|data:image/png;base64,)", document)
    assert "<script" not in document and "<link" not in document and "@import" not in document
    assert not re.search(r"url\(", document)
    assert "http://" not in document and "https://" not in document


def test_attention_maps_are_drawn_for_every_cls_layer(basic_report):
    _, document = basic_report
    attention = section_html(document, "attention")
    assert "CLS token" in attention and "4x4 patch grid" in attention
    (uri,) = image_sources(attention)
    image = decode_png(uri)
    assert image.shape[1] > image.shape[0]  # five columns (image + 4 layers) over four rows


def test_text_is_escaped(tmp_path):
    run = make_run(tmp_path, name='run <b>&"x"', generate=False)
    cfg_text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(cfg_text + "# </pre><script>alert(1)</script>\n")
    (run / "test_metrics.json").write_text(json.dumps({"test/<i>acc</i>": 0.25}))
    document = write_report([run], attention_images=0).read_text()
    assert "<script>" not in document and 'run <b>&"x"' not in document and "<i>acc" not in document
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in document
    assert "run &lt;b&gt;&amp;&quot;x&quot;" in document
    assert "test/&lt;i&gt;acc&lt;/i&gt;" in document


def test_evaluation_dynamics_and_other_outputs(tmp_path):
    from vitlab.evaluation.evaluate import evaluate_run

    run = make_run(tmp_path, generate=False)
    evaluate_run(run, max_batches=1, tta_views=2, severities=(1, 3))
    (run / "dynamics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dynamics_records()))
    run_fixtures.write_png(run / "probe" / "slot_k.png")
    (run / "probe" / "slot_k.json").write_text(json.dumps({"k_mean": 3.5, "note": "<probe>"}))
    (run / "probe" / ".partial.json.tmp").write_text("{")
    (run / "probe" / "being_written.json").write_text('{"k": [1, 2')
    document = write_report([run], attention_images=0).read_text()
    assert sections(document) == ["config", "curves", "test", "evaluation", "dynamics", "other"]

    evaluation = section_html(document, "evaluation")
    assert "TTA, 2 views" in evaluation and "gaussian_noise" in evaluation and "mean over corrupted" in evaluation
    assert len(image_sources(evaluation)) == 2  # reliability diagram, per-class accuracy
    dynamics = section_html(document, "dynamics")
    assert "1/4 frozen" in dynamics and "3/4 heads not converged" in dynamics
    assert len(image_sources(dynamics)) == 3  # drawn from dynamics.jsonl: drift/clusters, tau, frozen epochs
    assert re.search(r"<td>0</td><td>0</td>.*?<td>2</td></tr>", dynamics)  # head (0, 0) frozen at epoch 2
    other = section_html(document, "other")
    assert "probe/slot_k.png" in other and "probe/slot_k.json" in other and "&lt;probe&gt;" in other
    assert "reliability.png" not in other and "evaluation.json" not in other and ".partial" not in other
    assert "{&quot;k&quot;: [1, 2</pre>" in other  # an unreadable JSON file is shown as it is, not an error
    for uri in image_sources(document):
        decode_png(uri)


def test_existing_dynamics_figures_are_embedded_not_redrawn(tmp_path):
    run = make_run(tmp_path, generate=False)
    (run / "dynamics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dynamics_records()))
    run_fixtures.write_png(run / "dynamics" / "dynamics.png", (3, 7))
    document = write_report([run], attention_images=0).read_text()
    (uri,) = image_sources(section_html(document, "dynamics"))
    assert decode_png(uri).shape[:2] == (3, 7)
    assert "other" not in sections(document)


def test_cet_vit_run_shows_segment_maps_instead_of_cls_attention(tmp_path):
    run = make_run(tmp_path, preset="cet_vit_pico", generate=False)
    document = write_report([run], attention_images=3).read_text()
    assert "segments" in sections(document) and "attention" not in sections(document)
    segments = section_html(document, "segments")
    assert len(image_sources(segments)) == 1 and "argmax over the 16 slots" in segments


def test_missing_data_leaves_the_maps_out_with_a_warning(tmp_path):
    run = make_run(tmp_path, generate=False)
    cfg_text = (run / "config.yaml").read_text().replace("name: digits", "name: mnist")
    (run / "config.yaml").write_text(cfg_text.replace("root: data", f"root: {tmp_path / 'no-data'}"))
    with pytest.warns(UserWarning, match="attention and segment maps .* left out"):
        document = write_report([run]).read_text()
    assert "attention" not in sections(document) and "curves" in sections(document)


def test_comparison_page(tmp_path, monkeypatch):
    runs = [make_run(tmp_path / "a", "seed-run", seed=0), make_run(tmp_path / "b", "seed-run", seed=1)]
    monkeypatch.chdir(tmp_path)
    path = write_report(runs)
    assert path == tmp_path / REPORT_FILE
    document = path.read_text()
    assert sections(document) == ["runs", "metrics", "config-diff", "curves"]
    metrics = section_html(document, "metrics")
    assert "a/seed-run" in metrics and "b/seed-run" in metrics  # same folder names: told apart by their parents
    assert "<td><b>0.6</b></td>" in metrics and "<td><b>1.4</b></td>" in metrics  # best acc and best loss (run b)
    assert "generate/reconstruction/psnr" in metrics
    diff = section_html(document, "config-diff")
    assert "run.seed" in diff and "data.batch_size" not in diff
    assert len(image_sources(section_html(document, "curves"))) == 1


def test_command_line(tmp_path, capsys):
    run = make_run(tmp_path, generate=False)
    out = tmp_path / "pages" / "one.html"
    assert main(["report", str(run), "--out", str(out), "--attention-images", "0"]) == 0
    assert capsys.readouterr().out.strip() == f"report: {out}"
    assert sections(out.read_text()) == ["config", "curves", "test"]
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_bad_input_gets_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="at least one run directory"):
        write_report([])
    with pytest.raises(ConfigError, match="no config.yaml"):
        write_report([tmp_path])
    run = make_run(tmp_path, generate=False)
    with pytest.raises(ConfigError, match="attention_images must be >= 0"):
        write_report([run], attention_images=-1)
    (run / "test_metrics.json").write_text("{not json")
    with pytest.raises(ConfigError, match="test_metrics.json is not valid JSON"):
        write_report([run], attention_images=0)


# -------------------------------------------------------------------------------------------------------------------
def test_curve_panels_group_train_and_val_terms():
    rows = [
        {"epoch": 0, "step": 5, "train/loss": 2.0, "val/loss": 2.5, "lr-AdamW": 1e-3, "dynamics/frozen": 0.0},
        {"epoch": 1, "step": 10, "train/loss": 1.0, "val/acc": 0.5, "train/kl": float("nan"), "train/ce": 0.7},
    ]
    assert curve_panels(rows) == {
        "loss": {"train": ([0.0, 1.0], [2.0, 1.0]), "val": ([0.0], [2.5])},
        "acc": {"val": ([1.0], [0.5])},
        "learning rate": {"lr-AdamW": ([0.0], [1e-3])},
        "ce": {"train": ([1.0], [0.7])},
        "dynamics/frozen": {"dynamics/frozen": ([0.0], [0.0])},
    }
    assert curve_panels([]) == {}


def test_cls_attention_maps_hand_worked():
    attn = torch.zeros(1, 2, 5, 5)  # B=1, two heads, CLS + a 2x2 patch grid
    attn[0, 0, 0] = torch.tensor([0.2, 0.1, 0.2, 0.3, 0.2])
    attn[0, 1, 0] = torch.tensor([0.0, 0.4, 0.2, 0.2, 0.2])
    maps = {
        "blocks.0.attn": attn,
        "decoder.0.attn": torch.rand(1, 2, 4, 4),  # patches only (no CLS): left out
        "cross.attn": torch.rand(1, 2, 5, 3),  # not square: left out
    }
    result = cls_attention_maps(maps, (2, 2))
    assert list(result) == ["blocks.0.attn"]
    torch.testing.assert_close(result["blocks.0.attn"], torch.tensor([[[0.25, 0.2], [0.25, 0.2]]]))


def test_better_direction_and_config_differences():
    assert better_direction("test/acc") == "max" and better_direction("generate/reconstruction/psnr") == "max"
    assert better_direction("eval/mean_corrupted") == "max"
    assert better_direction("test/loss") == "min" and better_direction("eval/test_calibrated/ece") == "min"
    assert better_direction("generate/images/test") is None
    a, b = RunConfig(), RunConfig(run=RunSection(seed=3), model={"name": "vit_pico", "depth": 2})
    assert config_differences([a, b]) == {"model.depth": [None, 2], "run.seed": [0, 3]}
