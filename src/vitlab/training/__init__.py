"""Lightning tasks, callbacks and the fit/evaluate orchestration."""

from vitlab.training.cet_task import CETLossConfig, CETViTTask
from vitlab.training.tasks import BaseTask, ClassificationTask
from vitlab.training.vitcae_task import ViTCAETask

#: model class name -> Lightning task class; models without an entry are trained as classifiers
TASKS: dict[str, type[BaseTask]] = {"ViTCAE": ViTCAETask, "CETViT": CETViTTask}

__all__ = ["TASKS", "BaseTask", "CETLossConfig", "CETViTTask", "ClassificationTask", "ViTCAETask"]
