"""Research systems as families: each declares itself once as a :class:`Family`; the core looks them up here.

A family (ViTCAE, CET-ViT, a new paper) is one package that names its model classes, its Lightning task, the
config sections it contributes, its presets, its extra sub-commands and report sections. The declaration holds names
only (``"module:attribute"`` strings; a family outside vitlab may give the objects), so reading it loads no
deep-learning library: ``vitlab --help`` lists a family's commands without importing torch.

A family is one package whose import calls :func:`register_family` once. The core names none: on first use it imports
every sub-package of ``vitlab.families`` (the built-in ones: no list to keep, nothing to reinstall) and every entry
point of the group :data:`ENTRY_POINT_GROUP` that the installed distributions declare (a family from outside vitlab:
``[project.entry-points."vitlab.families"] mixer = "my_mixer"``; the entry point names the package, or a
:class:`Family` object, which is then registered).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import import_module
from importlib.metadata import entry_points
from pkgutil import iter_modules
from typing import Any

#: the entry-point group through which an installed package declares a family
ENTRY_POINT_GROUP = "vitlab.families"
#: the package whose sub-packages are the built-in families
BUILTIN_PACKAGE = "vitlab.families"

_FAMILIES: dict[str, Family] = {}
_loaded = False


def resolve(ref: Any) -> Any:
    """The object a ``"package.module:attribute"`` reference names; an object that is no string is itself."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(import_module(module), attr) if attr else import_module(module)


@dataclass(frozen=True)
class Family:
    """One research system, declared once.

    ``models``: its model classes (``"module:Class"``); a model that is an instance of one belongs to the family.
    Importing them registers the family's presets (``vitlab.models.registry.register_preset``).
    ``task``: its Lightning task (``"module:Class"``, a ``BaseTask`` subclass) for those models.
    ``config_types``: config section -> type that types and checks the section: ``model``, the frozen dataclass of the
    constructor options (``vitlab.config.model.takes_options``; none declared: the section takes no option);
    ``loss``, the task's dataclass (none declared: the section takes no key).
    ``presets``: its catalogue (``"module:TABLE"`` of a module that imports no torch, or the table): preset name ->
    ``(model class name, one-line description)``, what the config check and ``vitlab list-models`` read.
    ``commands``: modules whose import registers the family's extra ``vitlab`` sub-commands.
    ``report_sections``: the run-report sections the family adds (``"module:function"``, ``run -> Section | None``).
    ``explainer``: how ``vitlab.explain`` reaches its models (``"module:function"``, ``model -> Explainer``).
    ``evaluation``: the metrics ``vitlab evaluate`` takes of a ``SlotAssigner``'s assignment ``S`` (a module, or an
    object, with ``image_metrics(S) -> {name: [B]}`` and ``report(metrics, labels, class_accuracy, class_names, seed)
    -> dict``, the ``assignment`` section of ``evaluation.json``); empty: none.
    ``bench_objective``: the training loss ``vitlab bench`` times for its models (``"module:function"``,
    ``(model, x, y) -> scalar``), what its task computes with the loss section's defaults; empty: the cross-entropy
    of the model's output, as for every classifier.
    """

    name: str
    models: tuple[str | type, ...]
    task: str | type
    config_types: Mapping[str, str | type] = field(default_factory=dict)
    presets: str | Mapping[str, Any] = ""
    commands: tuple[str, ...] = ()
    report_sections: tuple[str | Any, ...] = ()
    explainer: str | Any = ""
    evaluation: str | Any = ""
    bench_objective: str | Any = ""

    def model_classes(self) -> tuple[type, ...]:
        return tuple(resolve(ref) for ref in self.models)

    def task_class(self) -> type:
        return resolve(self.task)

    def catalogue(self) -> Mapping[str, tuple[str, str]]:
        return resolve(self.presets) if self.presets else {}

    def preset_names(self) -> tuple[str, ...]:
        return tuple(self.catalogue())

    def config_type(self, section: str) -> type | None:
        ref = self.config_types.get(section)
        return None if ref is None else resolve(ref)


def register_family(family: Family) -> Family:
    """Declare ``family``; a second family of the same name is refused."""
    if family.name in _FAMILIES and _FAMILIES[family.name] != family:
        raise ValueError(f"family {family.name!r} is registered twice")
    _FAMILIES[family.name] = family
    return family


def unregister_family(name: str) -> None:
    """Forget the family ``name`` (tests that register a toy family clean up with this)."""
    _FAMILIES.pop(name, None)


def families() -> Iterator[Family]:
    """Every declared family, the built-in ones first."""
    global _loaded
    if not _loaded:
        package = import_module(BUILTIN_PACKAGE)
        for info in iter_modules(package.__path__, f"{BUILTIN_PACKAGE}."):
            import_module(info.name)
        for entry_point in entry_points(group=ENTRY_POINT_GROUP):
            declared = entry_point.load()
            if isinstance(declared, Family):
                register_family(declared)
        _loaded = True  # after every family loaded: a failure is raised again on the next call, not half-hidden
    yield from list(_FAMILIES.values())


def family_of(model: object) -> Family | None:
    """The family whose model classes ``model`` is an instance of, or None (a plain classifier)."""
    for family in families():
        if isinstance(model, family.model_classes()):
            return family
    return None


def family_of_class(cls: type) -> Family | None:
    """The family of the model class ``cls`` (a preset's class), or None."""
    for family in families():
        if issubclass(cls, family.model_classes()):
            return family
    return None
