"""The run report: collect (the page's data: sections present for what a run has and absent for what it lacks,
their tables, texts and figures), render (images embedded as PNG data URIs, text escaped, no external URLs),
comparison pages, the command, and the pure pieces against hand-worked cases."""

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
from vitlab.diagnostics.images import cls_attention_maps
from vitlab.errors import ConfigError
from vitlab.report import collect, render, write_report
from vitlab.report.comparison import better_direction, config_differences
from vitlab.report.curves import curve_panels
from vitlab.report.page import Facts, Figures, Table
from vitlab.report.render import images
from vitlab.rundir import REPORT_FILE

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


def section_ids(document: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)"', document)


def image_sources(document: str) -> list[str]:
    return re.findall(r'<img\b[^>]*\bsrc="([^"]*)"', document)


def decode_png(uri_or_bytes) -> np.ndarray:
    if isinstance(uri_or_bytes, str):
        prefix = "data:image/png;base64,"
        assert uri_or_bytes.startswith(prefix), uri_or_bytes[:40]
        uri_or_bytes = base64.b64decode(uri_or_bytes[len(prefix) :], validate=True)
    assert uri_or_bytes.startswith(PNG_SIGNATURE)
    return matplotlib.image.imread(io.BytesIO(uri_or_bytes), format="png")


def drawn(section) -> list[np.ndarray]:
    """The images of a section, drawn as the renderer draws them, decoded."""
    return [decode_png(image.uri) for block in section.find(Figures) for image in images(block)]


@pytest.fixture(scope="module")
def basic_run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def basic_page(basic_run):
    return collect([basic_run])


# -------------------------------------------------------------------------------------------------------------------
def test_report_of_one_run_has_the_sections_the_run_has(basic_page):
    page = basic_page
    assert page.section_ids == ["config", "curves", "test", "generate", "attention", "explanations"]
    assert page.title == "vit-run" and ("model", "vit_pico") in page.cards and ("test/acc", 0.5) in page.cards
    config = page.section("config")
    assert "name: vit-run" in config.text and [d.summary for d in config.blocks] == [
        "Resolved config (config.yaml)",
        "Environment (env.json)",
    ]
    assert f"torch {torch.__version__}" in config.text
    (facts,) = page.section("test").find(Facts)
    assert facts.values == {"test/acc": 0.5, "test/loss": 1.5}
    generate = page.section("generate")
    assert generate.find(Facts)[0].values == {"reconstruction/psnr": 21.5}
    assert [f.caption for f in generate.figures] == ["Reconstruction: test images and their reconstructions."]


def test_the_written_page_embeds_every_image_and_fetches_nothing(basic_run):
    path = write_report([basic_run])
    document = path.read_text()
    assert path.name == REPORT_FILE and path.parent == basic_run
    assert section_ids(document) == ["config", "curves", "test", "generate", "attention", "explanations"]
    for absent in ("evaluation", "dynamics", "segments", "other"):
        assert f'href="#{absent}"' not in document
    sources = image_sources(document)
    assert len(sources) == 4  # curves, the reconstruction grid, the attention maps, the explanations
    for uri in sources:
        image = decode_png(uri)
        assert image.shape[0] > 0 and image.shape[1] > 0
    assert not re.search(r"(?:src|href)=\"(?!#|data:image/png;base64,)", document)
    assert "<script" not in document and "<link" not in document and "@import" not in document
    assert not re.search(r"url\(", document)
    assert "http://" not in document and "https://" not in document


def test_attention_maps_are_drawn_for_every_cls_layer(basic_page):
    attention = basic_page.section("attention")
    assert "CLS token" in attention.text and "4x4 patch grid" in attention.text
    (figure,) = attention.figures
    maps = figure.plot.data["layer_maps"]
    assert list(maps) == [f"blocks.{i}.attn" for i in range(4)] and all(m.shape == (4, 4, 4) for m in maps.values())
    assert figure.plot.data["labels"] == ["0", "1", "2", "3"]  # the first test image of each class
    (image,) = drawn(attention)
    assert image.shape[1] > image.shape[0]  # five columns (image + 4 layers) over four rows


def test_text_is_escaped(tmp_path):
    run = make_run(tmp_path, name='run <b>&"x"', generate=False)
    cfg_text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(cfg_text + "# </pre><script>alert(1)</script>\n")
    (run / "test_metrics.json").write_text(json.dumps({"test/<i>acc</i>": 0.25}))
    page = collect([run], attention_images=0)
    assert page.section("test").find(Facts)[0].values == {"test/<i>acc</i>": 0.25}  # the data holds the text as is
    document = render(page)
    assert "<script>" not in document and 'run <b>&"x"' not in document and "<i>acc" not in document
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in document
    assert "run &lt;b&gt;&amp;&#34;x&#34;" in document
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
    page = collect([run], attention_images=0)
    assert page.section_ids == ["config", "curves", "test", "evaluation", "dynamics", "other"]

    evaluation = page.section("evaluation")
    metrics, corruptions = evaluation.find(Table)
    assert [row[0] for row in metrics.rows][::2] == ["test", "TTA, 2 views"]
    assert corruptions.header == ["corruption", "1", "3", "mean"] and corruptions.rows[0][0] == "gaussian_noise"
    assert [row[0] for row in corruptions.rows[-2:]] == ["mean over corrupted", "clean"]
    assert [f.caption for f in evaluation.figures] == [
        "Reliability diagram of the test set, before and after scaling.",
        "Per-class test accuracy.",
    ]
    dynamics = page.section("dynamics")
    assert "1/4 frozen" in dynamics.text and "3/4 heads not converged" in dynamics.text
    assert len(drawn(dynamics)) == 3  # drawn from dynamics.jsonl: drift/clusters, tau, frozen epochs
    (heads,) = dynamics.find(Table)
    assert heads.rows[0][:2] == (0, 0) and heads.rows[0][-2] == 2  # head (0, 0) frozen at epoch 2 (then: why)
    other = page.section("other")
    assert [f.caption for f in other.figures] == ["probe/slot_k.png"]
    assert "probe/slot_k.json" in other.text and "<probe>" in other.text
    assert "reliability.png" not in other.text and "evaluation.json" not in other.text and ".partial" not in other.text
    assert '{"k": [1, 2' in other.text  # an unreadable JSON file is shown as it is, not an error
    document = render(page)
    assert "&lt;probe&gt;" in document
    for uri in image_sources(document):
        decode_png(uri)


def test_existing_dynamics_figures_are_embedded_not_redrawn(tmp_path):
    run = make_run(tmp_path, generate=False)
    (run / "dynamics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dynamics_records()))
    run_fixtures.write_png(run / "dynamics" / "dynamics.png", (3, 7))
    page = collect([run], attention_images=0)
    (figure,) = page.section("dynamics").figures
    assert figure.plot is None and decode_png(figure.png).shape[:2] == (3, 7)
    assert "other" not in page.section_ids


def test_explanations_show_every_applicable_method_side_by_side(basic_page):
    explanations = basic_page.section("explanations")
    (figure,) = explanations.figures
    methods = ["attention", "rollout", "grad_rollout", "lrp", "gradcam", "integrated_gradients"]
    assert list(figure.plot.data["maps"]) == methods
    assert all(m.shape == (4, 8, 8) for m in figure.plot.data["maps"].values())
    (image,) = drawn(explanations)
    assert image.shape[1] > image.shape[0]  # seven columns (image + 6 methods) over four rows


def _logits_plus_their_sign(monkeypatch) -> None:
    """The ViT's logits plus their own sign: an operation held constant that enters a sum, which LRP refuses only
    when its rules meet it (no declaration of the model says so)."""
    from vitlab.models.vit import VisionTransformer

    head = VisionTransformer.forward_head
    monkeypatch.setattr(VisionTransformer, "forward_head", lambda self, x, **kw: (y := head(self, x, **kw)) + y.sign())


def test_a_method_refused_at_run_time_is_left_out_in_one_line_and_the_others_shown(tmp_path, monkeypatch):
    _logits_plus_their_sign(monkeypatch)
    explanations = collect([make_run(tmp_path)]).section("explanations")
    (figure,) = explanations.figures
    assert list(figure.plot.data["maps"]) == ["attention", "rollout", "grad_rollout", "gradcam", "integrated_gradients"]
    assert "Left out. lrp: the output of sign, which carries no relevance back" in explanations.text


def test_cet_vit_run_shows_segment_maps_instead_of_cls_attention(tmp_path):
    run = make_run(tmp_path, preset="cet_vit_pico", generate=False)
    page = collect([run], attention_images=3)
    assert "segments" in page.section_ids and "attention" not in page.section_ids
    assert "grad_rollout: CET-ViT has no CLS token" in page.section("explanations").text
    segments = page.section("segments")
    (figure,) = segments.figures
    assert figure.plot.kind == "segments" and figure.plot.data["S"].shape[:2] == (3, 16)
    assert "argmax over the 16 slots" in segments.text
    usage = figure.plot.data["S"].sum(1)
    slot_k = (usage / usage.sum(-1, keepdim=True) > 0.05).sum(-1).tolist()  # the card's slot-usage K, by hand
    assert figure.plot.data["titles"] == [f"{label}, K = {k}" for label, k in zip(["0", "1", "2"], slot_k, strict=True)]
    assert len(drawn(segments)) == 1


def test_missing_data_leaves_the_maps_out_with_a_warning(tmp_path):
    run = make_run(tmp_path, generate=False)
    cfg_text = (run / "config.yaml").read_text().replace("name: digits", "name: mnist")
    (run / "config.yaml").write_text(cfg_text.replace("root: data", f"root: {tmp_path / 'no-data'}"))
    with pytest.warns(UserWarning, match="attention and segment maps .* left out"):
        page = collect([run])
    assert "attention" not in page.section_ids and "curves" in page.section_ids


def test_comparison_page(tmp_path, monkeypatch):
    runs = [make_run(tmp_path / "a", "seed-run", seed=0), make_run(tmp_path / "b", "seed-run", seed=1)]
    page = collect(runs)
    assert page.section_ids == ["runs", "metrics", "config-diff", "curves"]
    (metrics,) = page.section("metrics").find(Table)
    assert metrics.header == ["metric", "a/seed-run", "b/seed-run"]  # same folder names: told apart by their parents
    rows = {row[0]: (index, row[1:]) for index, row in enumerate(metrics.rows)}
    assert rows["test/acc"][1] == (0.5, 0.6) and (rows["test/acc"][0], 2) in metrics.bold  # best acc: run b
    assert rows["test/loss"][1] == (1.5, 1.4) and (rows["test/loss"][0], 2) in metrics.bold  # best loss: run b
    assert rows["generate/reconstruction/psnr"][1] == (21.5, 21.5)
    (diff,) = page.section("config-diff").find(Table)
    assert [row[0] for row in diff.rows] == ["run.seed"]
    assert len(page.section("curves").figures) == 1
    monkeypatch.chdir(tmp_path)
    path = write_report(runs)
    assert path == tmp_path / REPORT_FILE
    document = path.read_text()
    assert "<td><b>0.6</b></td>" in document and "<td><b>1.4</b></td>" in document
    assert len(image_sources(document)) == 1


def test_command_line(tmp_path, capsys):
    run = make_run(tmp_path, generate=False)
    out = tmp_path / "pages" / "one.html"
    assert main(["report", str(run), "--out", str(out), "--attention-images", "0"]) == 0
    assert capsys.readouterr().out.strip() == f"report: {out}"
    assert section_ids(out.read_text()) == ["config", "curves", "test"]
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
    result = cls_attention_maps(maps, (2, 2))  # vitlab.diagnostics.images
    assert list(result) == ["blocks.0.attn"]
    torch.testing.assert_close(result["blocks.0.attn"], torch.tensor([[[0.25, 0.2], [0.25, 0.2]]]))


def test_better_direction_and_config_differences():
    assert better_direction("test/acc") == "max" and better_direction("generate/reconstruction/psnr") == "max"
    assert better_direction("eval/mean_corrupted") == "max"
    assert better_direction("test/loss") == "min" and better_direction("eval/test_calibrated/ece") == "min"
    assert better_direction("generate/images/test") is None
    a, b = RunConfig(), RunConfig(run=RunSection(seed=3), model={"name": "vit_pico", "depth": 2})
    assert config_differences([a, b]) == {"model.depth": [None, 2], "run.seed": [0, 3]}


def test_vitcae_curves_draw_the_training_mmd_of_samples_apart_from_the_validation_mmd_of_means(tmp_path):
    from vitlab.rundir import RunDir

    run_dir = tmp_path / "vitcae"
    argv = ["fit", "--config", "vitcae/digits", f"run.dir={run_dir}", "trainer.max_epochs=1", *run_fixtures.TINY]
    assert main([*argv, "run.export=false", "loss.warmup_epochs=1"]) == 0
    panels = curve_panels(RunDir(run_dir).metrics())
    for term in ("mmd_cls", "mmd_pt", "mmd_share_cls", "mmd_share_pt"):
        assert list(panels[term]) == ["train"] and list(panels[f"{term}_mu"]) == ["val"], term
    assert list(panels["kl_cls"]) == ["train", "val"], "the KL terms are the same function in both"
    assert "test/mmd_cls_mu" in json.loads((run_dir / "test_metrics.json").read_text())
