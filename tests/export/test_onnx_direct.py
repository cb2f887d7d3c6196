"""``torch.onnx.export`` straight on a model of every family (as a user exports a timm model), with autograd on
and off; onnxruntime gives PyTorch's logits to 1e-4. ViTCAE: its encoder, the classifier timm builds for it."""

import numpy as np
import onnxruntime as ort
import pytest
import timm
import torch

from vitlab.timm_registry import PREFIX

FAMILIES = ["vit_pico", "tome_pico", "swin_pico", "cet_vit_pico", "cet_vit_nano_global", "vitcae_pico"]


@pytest.mark.slow  # about 10 s an export on a 2-core CPU
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("name", FAMILIES)
def test_torch_onnx_export_runs_in_onnxruntime_with_the_same_logits(name, grad, tmp_path):
    torch.manual_seed(0)
    model = timm.create_model(PREFIX + name, pretrained=False).eval()
    x = torch.randn(2, *model.pretrained_cfg["input_size"])
    path = tmp_path / "model.onnx"
    with torch.set_grad_enabled(grad):
        torch.onnx.export(model, (x,), path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        expected = model(x).numpy()
    assert logits.shape == expected.shape and np.abs(logits - expected).max() < 1e-4
