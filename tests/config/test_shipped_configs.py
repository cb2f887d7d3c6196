"""Every config shipped under ``vitlab/configs`` builds: each section typed and checked, as ``vitlab fit`` would."""

import pytest

from vitlab.config import CONFIG_ROOT, build_config, dump_yaml, load_yaml
from vitlab.config.coerce import to_dict

SHIPPED = sorted(str(p.relative_to(CONFIG_ROOT).with_suffix("")) for p in CONFIG_ROOT.rglob("*.yaml"))


def test_there_are_shipped_configs():
    assert {"vit/digits", "vitcae/digits", "cet_vit/digits"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_config_builds_and_keeps_its_values(name):
    cfg = build_config(name)
    written = load_yaml(name)
    assert dict(cfg.model) == {**written["model"], **dict(cfg.model)}
    assert to_dict(cfg.loss) == written.get("loss", {})
    assert dump_yaml(cfg)
