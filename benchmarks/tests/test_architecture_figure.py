"""docs/img/architecture.svg is drawn from the layers contract: a change of the contract must redraw it."""

from benchmarks.reports import architecture_figure


def test_the_architecture_figure_is_the_layers_contract():
    assert architecture_figure.main(["--check"]) == 0, "run python -m benchmarks.reports.architecture_figure"


def test_the_figure_names_every_layer_of_the_contract():
    layers, families = architecture_figure.contract_layers()
    svg = architecture_figure.render(layers, families)
    for row in layers:
        for name in row:
            if name != "families":
                assert f">{name}<" in svg
    assert families == ["cet_vit", "vitcae"] and ">families.cet_vit<" in svg
