"""The model catalogue (what the config checks and `vitlab list-models` read without torch) agrees with the registry:
the core's table and each family's, every preset with its class and description, every class's options."""

import pprint

from vitlab.config.model import catalogue, model_options
from vitlab.models.registry import constructor_args, get_preset
from vitlab.testing import builtin_presets


def test_the_catalogue_lists_every_preset_and_option_of_the_registry():
    presets = {name: (get_preset(name).cls.__name__, get_preset(name).description) for name in builtin_presets()}
    assert presets == {name: catalogue()[name] for name in presets}, (
        "update vitlab/model_catalogue.py or the family's table:\n" + pprint.pformat(presets)
    )
    for name in presets:
        cls = get_preset(name).cls
        assert set(model_options(cls.__name__)) == set(constructor_args(cls)), name
