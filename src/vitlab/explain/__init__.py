"""Explanations of a classifier's prediction for every family: attention, rollout, gradient-weighted rollout, a
conservative LRP, Grad-CAM and integrated gradients (:func:`explain`), and their faithfulness
(:mod:`vitlab.explain.evaluate`). The libraries behind Grad-CAM and integrated gradients are the ``explain`` extra.

The package is callable: ``vitlab.explain(model, images, method="lrp")`` is :func:`explain`.
"""

import sys
import types

from vitlab.explain.adapters import METHODS, Explainer, MethodRefused, explainer_for
from vitlab.explain.api import Explanation, explain, explainer_on


class _CallablePackage(types.ModuleType):
    def __call__(self, *args, **kwargs) -> Explanation:
        return explain(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

__all__ = ["METHODS", "Explainer", "Explanation", "MethodRefused", "explain", "explainer_for", "explainer_on"]
