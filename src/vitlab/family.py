"""Research systems as families: each declares itself once as a :class:`Family`; the core looks them up here.

A family (ViTCAE, CET-ViT, a new paper) is one package that names its model classes, its Lightning task, the
config sections it contributes, its presets, its extra sub-commands and report sections. The declaration holds names
only (``"module:attribute"`` strings; a family outside vitlab may give the objects), so reading it loads no
deep-learning library: ``vitlab --help`` lists a family's commands without importing torch.

A family is one package whose import calls :func:`register_family` once. The core names none: on first use (not at
``import vitlab``) it imports every sub-package of ``vitlab.families`` (the built-in ones: no list to keep, nothing to
reinstall) and every entry point of the group :data:`ENTRY_POINT_GROUP` that the installed distributions declare (a
family from outside vitlab, a plug-in: ``[project.entry-points."vitlab.families"] mixer = "my_mixer"``; the entry
point names the package, or a :class:`Family` object, which is then registered). A family's model classes, config
types and commands are imported only when one of its presets, sections or commands is asked for.

A plug-in fails alone: one that cannot be imported, or whose declaration is wrong, is left out with one
:class:`PluginWarning` that names its distribution and entry point; the other families and every command go on.
``VITLAB_NO_PLUGINS=1`` loads no entry point at all. Writing a family: docs/writing_a_family.md.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import import_module
from importlib.metadata import EntryPoint, entry_points
from pkgutil import iter_modules
from typing import Any, NamedTuple

from vitlab.errors import FamilyError
from vitlab.model_catalogue import CORE_MODELS, PRESETS

#: the entry-point group through which an installed package declares a family
ENTRY_POINT_GROUP = "vitlab.families"
#: the package whose sub-packages are the built-in families
BUILTIN_PACKAGE = "vitlab.families"
#: the version of the family API this vitlab implements (CHANGELOG.md lists each version's changes): a family declared
#: for a later one is refused in one line; one written for API 1 works, with a deprecation line for each old call
FAMILY_API = 2
#: set to 1 to load no plug-in (no entry point of :data:`ENTRY_POINT_GROUP`)
NO_PLUGINS_ENV = "VITLAB_NO_PLUGINS"


class PluginWarning(RuntimeWarning):
    """A plug-in family that is left out: it cannot be imported, or its declaration is wrong."""


class PresetRow(NamedTuple):
    """One row of a preset table: the model class (the name of one of the family's ``models``, or of a core model:
    :data:`vitlab.model_catalogue.CORE_MODELS`), a one-line description, the constructor's keyword arguments."""

    model: str
    description: str
    kwargs: Mapping[str, Any] = {}


_FAMILIES: dict[str, Family] = {}
#: family name -> where a plug-in came from ("the entry point NAME = VALUE of the distribution DIST")
_ORIGINS: dict[str, str] = {}
#: the names of the built-in families (the sub-packages of vitlab.families)
_BUILTIN: set[str] = set()
_loaded = False
_warned: set[str] = set()


def resolve(ref: Any) -> Any:
    """The object a ``"package.module:attribute"`` reference names; an object that is no string is itself."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(import_module(module), attr) if attr else import_module(module)


def _ref_name(ref: str | type) -> str:
    return ref.rpartition(":")[2] if isinstance(ref, str) else ref.__name__


@dataclass(frozen=True)
class Family:
    """One research system, declared once.

    ``models``: its model classes (``"module:Class"``); a model that is an instance of one belongs to the family.
    ``task``: its Lightning task (``"module:Class"``, a ``BaseTask`` subclass) for those models.
    ``config_types``: config section -> type that types and checks the section: ``model``, the frozen dataclass of the
    constructor options (``vitlab.config.model.takes_options``; none declared: the section takes no option);
    ``loss``, the loss options' dataclass, declared here only: the config check and the task (``BaseTask.loss_config``)
    read it (none declared: the section takes no key).
    ``presets``: its preset table (``"module:TABLE"`` of a module that imports no torch, or the table): preset name ->
    ``(model class name, one-line description, constructor arguments)`` (:class:`PresetRow`; the arguments may be
    left out). The config check and ``vitlab list-models`` read it; the model registry builds from it.
    ``commands``: modules whose import registers the family's extra ``vitlab`` sub-commands.
    ``report_sections``: the run-report sections the family adds (``"module:function"``, ``run -> Section | None``).
    ``explainer``: how ``vitlab.explain`` reaches its models (``"module:function"``, ``model -> Explainer``).
    ``evaluation``: the metrics ``vitlab evaluate`` takes of a ``SlotAssigner``'s assignment ``S`` (a module, or an
    object, with ``image_metrics(S) -> {name: [B]}`` and ``report(metrics, labels, class_accuracy, class_names, seed)
    -> dict``, the ``assignment`` section of ``evaluation.json``); empty: none.
    ``api``: the family API it is written for (:data:`FAMILY_API`, the default; CHANGELOG.md).
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
    api: int = FAMILY_API

    def model_classes(self) -> tuple[type, ...]:
        return tuple(resolve(ref) for ref in self.models)

    def model_class_names(self) -> tuple[str, ...]:
        """The names of its model classes, from the declaration alone (no model is imported)."""
        return tuple(_ref_name(ref) for ref in self.models)

    def task_class(self) -> type:
        return resolve(self.task)

    def table(self) -> dict[str, PresetRow]:
        """Its preset table, each row a :class:`PresetRow`."""
        return {name: PresetRow(*row) for name, row in (resolve(self.presets) if self.presets else {}).items()}

    def catalogue(self) -> dict[str, tuple[str, str]]:
        """preset name -> (model class name, description)."""
        return {name: (row.model, row.description) for name, row in self.table().items()}

    def preset_names(self) -> tuple[str, ...]:
        return tuple(self.table())

    def config_type(self, section: str) -> type | None:
        ref = self.config_types.get(section)
        return None if ref is None else resolve(ref)


def _check_presets(family: Family) -> None:
    """Each preset of ``family`` is new to the namespace and names one of its models or a core model: else a
    :class:`FamilyError` that says the family is wrong, not the user's config."""
    owners = {name: "vitlab (its core)" for name in PRESETS}
    owners |= {name: f"the family {other.name!r}" for other in _FAMILIES.values() for name in other.table()}
    own = family.model_class_names()
    for name, row in family.table().items():
        if name in owners:
            raise FamilyError(
                f"the preset {name!r} is declared by {owners[name]} and by the family {family.name!r}; "
                "one preset namespace: rename it in the family's table"
            )
        if row.model not in own and row.model not in CORE_MODELS:
            raise FamilyError(
                f"the family {family.name!r} declares the preset {name!r} of class {row.model!r}, which is none of "
                f"its models ({', '.join(own) or 'none'}) nor a core model ({', '.join(CORE_MODELS)}): an error in "
                "the family's preset table, not in your config"
            )


def register_family(family: Family) -> Family:
    """Declare ``family``: a second family of the same name, or a preset that another declares or whose class is not
    one of the family's models, is refused (:class:`FamilyError`)."""
    if family.name in _FAMILIES:
        if _FAMILIES[family.name] == family:
            return family
        raise FamilyError(f"family {family.name!r} is registered twice")
    if family.api > FAMILY_API:
        raise FamilyError(
            f"the family {family.name!r} is written for vitlab's family API {family.api}, and this vitlab implements "
            f"API {FAMILY_API}: upgrade vitlab (pip install -U vitlab) or use an older release of the plug-in"
        )
    _check_presets(family)
    _FAMILIES[family.name] = family
    return family


def unregister_family(name: str) -> None:
    """Forget the family ``name`` (tests that register a toy family clean up with this)."""
    _FAMILIES.pop(name, None)
    _ORIGINS.pop(name, None)


def error_line(error: BaseException) -> str:
    """``Type: the first line of the message``: an error of a plug-in or an optional library, in one line."""
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"


def plugin_failed(what: str, error: BaseException, left_out: bool = True) -> None:
    """One :class:`PluginWarning` line (once per ``what``): a plug-in is left out (or, ``left_out=False``, uses a
    deprecated part of the family API), and how to fix or switch it off."""
    if what in _warned:
        return
    _warned.add(what)
    message = f"{what} is left out ({error_line(error)}); fix or uninstall it, or set {NO_PLUGINS_ENV}=1"
    warnings.warn(message if left_out else f"{what}: {error}", PluginWarning, stacklevel=3)


def _origin(entry_point: EntryPoint) -> str:
    dist = entry_point.dist.name if entry_point.dist is not None else "an unknown distribution"
    return f"the vitlab plug-in {entry_point.name} = {entry_point.value} of the distribution {dist}"


def _load_plugin(entry_point: EntryPoint) -> None:
    """Register the family ``entry_point`` names; a failure leaves it (and all it registered) out, with a warning."""
    before = set(_FAMILIES)
    try:
        declared = entry_point.load()
        if isinstance(declared, Family):
            register_family(declared)
    except Exception as error:  # a plug-in's ImportError, a wrong declaration: its own, never the other families'
        for name in set(_FAMILIES) - before:
            unregister_family(name)
        plugin_failed(_origin(entry_point), error)
        return
    _ORIGINS.update({name: _origin(entry_point) for name in set(_FAMILIES) - before})


def builtin(family: Family) -> bool:
    """Whether ``family`` is one of vitlab's own (a sub-package of ``vitlab.families``)."""
    return family.name in _BUILTIN


def origin(family: Family) -> str | None:
    """Where a plug-in family came from (its distribution and entry point); None for a built-in one."""
    return _ORIGINS.get(family.name)


def families() -> Iterator[Family]:
    """Every declared family, the built-in ones first, then the plug-ins that load (unless ``VITLAB_NO_PLUGINS``)."""
    global _loaded
    if not _loaded:
        package = import_module(BUILTIN_PACKAGE)
        before = set(_FAMILIES)
        for info in iter_modules(package.__path__, f"{BUILTIN_PACKAGE}."):
            import_module(info.name)
        _BUILTIN.update(set(_FAMILIES) - before)
        _loaded = True  # a built-in family that fails raises (a bug in vitlab); a plug-in warns, once
        if os.environ.get(NO_PLUGINS_ENV, "") in ("", "0"):
            for entry_point in entry_points(group=ENTRY_POINT_GROUP):
                _load_plugin(entry_point)
    yield from list(_FAMILIES.values())


def load_part(family: Family, load: Callable[[], Any], part: str, default: Any = None) -> Any:
    """``load()``, a part of ``family`` (its models, its commands); a plug-in's that fails gives ``default`` with one
    warning, so that a broken plug-in stops none of the others and no command of the core. A built-in family's
    failure is raised: a bug in vitlab."""
    if family.name not in _ORIGINS:
        return load()
    try:
        return load()
    except Exception as error:
        plugin_failed(f"{_ORIGINS[family.name]} ({part})", error)
        return default


def model_classes(family: Family) -> tuple[type, ...]:
    """``family.model_classes()``; none for a plug-in whose models cannot be imported (:func:`load_part`)."""
    return load_part(family, family.model_classes, "its models", ())


def family_of(model: object) -> Family | None:
    """The family whose model classes ``model`` is an instance of, or None (a plain classifier)."""
    return next((family for family in families() if isinstance(model, model_classes(family))), None)


def family_of_class(cls: type) -> Family | None:
    """The family of the model class ``cls`` (a preset's class), or None."""
    return next((family for family in families() if issubclass(cls, model_classes(family))), None)


def presets() -> dict[str, tuple[Family | None, PresetRow]]:
    """The one preset namespace: preset -> (its family, None for the core's; its row), the core's first."""
    namespace: dict[str, tuple[Family | None, PresetRow]] = {
        name: (None, PresetRow(*row)) for name, row in PRESETS.items()
    }
    for family in families():
        namespace |= {name: (family, row) for name, row in family.table().items()}
    return namespace
