"""The model catalogue (what the config checks read without torch) agrees with the registry."""

import pprint

from vitlab.model_catalogue import MODEL_OPTIONS, PRESET_CLASSES
from vitlab.models.registry import constructor_args, get_preset, list_models


def test_the_catalogue_lists_every_preset_and_option_of_the_registry():
    presets = {name: get_preset(name).cls.__name__ for name in list_models()}
    options = {get_preset(name).cls.__name__: tuple(sorted(constructor_args(get_preset(name).cls))) for name in presets}
    assert presets == PRESET_CLASSES, "update vitlab/model_catalogue.py:\n" + pprint.pformat(presets)
    assert options == MODEL_OPTIONS, "update vitlab/model_catalogue.py:\n" + pprint.pformat(options)
