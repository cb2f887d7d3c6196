"""How the explanation methods reach ViTCAE: through its encoder, a CLS-token ViT of the shared ``Attention``."""

from vitlab.explain.adapters import Explainer, vit_explainer


def explainer(model) -> Explainer:
    return vit_explainer(model.encoder, "vitcae")
