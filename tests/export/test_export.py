"""Exported models: the public names, the weights' checksum, the device check."""

import vitlab
import vitlab.export


def test_export_model_is_a_top_level_name():
    assert vitlab.export_model is vitlab.export.export_model
    assert "export_model" in vitlab.__all__ and "export_model" in dir(vitlab)
