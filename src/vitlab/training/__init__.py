"""Lightning tasks, callbacks and the fit/evaluate orchestration. The families' tasks live in their packages
(``vitlab.families``); ``CETViTTask``, ``CETLossConfig``, ``ViTCAETask`` and ``TASKS`` are named here lazily for
code that imports them from ``vitlab.training``."""

from typing import TYPE_CHECKING, Any

from vitlab.lazy import lazy_exports
from vitlab.training.tasks import BaseTask, ClassificationTask

if TYPE_CHECKING:
    from vitlab.families.cet_vit.task import CETLossConfig, CETViTTask
    from vitlab.families.vitcae.task import ViTCAETask

_LAZY = {
    "CETLossConfig": "vitlab.families.cet_vit.task",
    "CETViTTask": "vitlab.families.cet_vit.task",
    "ViTCAETask": "vitlab.families.vitcae.task",
}
_lazy_getattr, __dir__ = lazy_exports(__name__, _LAZY, globals())


def __getattr__(name: str) -> Any:
    if name == "TASKS":  # model class name -> task class, as the families declare them (``vitlab.family``)
        from vitlab.family import families

        return {cls.__name__: f.task_class() for f in families() for cls in f.model_classes()}
    return _lazy_getattr(name)


__all__ = ["TASKS", "BaseTask", "CETLossConfig", "CETViTTask", "ClassificationTask", "ViTCAETask"]
