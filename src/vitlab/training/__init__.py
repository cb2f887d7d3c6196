"""Lightning tasks, callbacks and the fit/evaluate orchestration."""

from vitlab.training.cet_task import CETLossConfig, CETViTTask
from vitlab.training.tasks import BaseTask, ClassificationTask
from vitlab.training.vitcae_task import ViTCAETask

#: model class name -> Lightning task class, as the built-in families declare them (``vitlab.family``); kept for
#: code that read it, the training itself asks ``vitlab.family.family_of``
TASKS: dict[str, type[BaseTask]] = {"ViTCAE": ViTCAETask, "CETViT": CETViTTask}

__all__ = ["TASKS", "BaseTask", "CETLossConfig", "CETViTTask", "ClassificationTask", "ViTCAETask"]
