"""Lightning tasks, callbacks and the fit/evaluate orchestration."""

from vitlab.training.tasks import BaseTask, ClassificationTask

#: model class name -> Lightning task class; models without an entry are trained as classifiers
TASKS: dict[str, type[BaseTask]] = {}

__all__ = ["TASKS", "BaseTask", "ClassificationTask"]
