"""Lightning tasks, callbacks and the fit/evaluate orchestration. The families' tasks live in their packages
(``vitlab.families``)."""

from vitlab.training.tasks import BaseTask, ClassificationTask

__all__ = ["BaseTask", "ClassificationTask"]
