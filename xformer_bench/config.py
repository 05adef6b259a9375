"""Where the config lives and what it is made of: the config groups (the folders of conf/) and
the resolved run config for a list of overrides, composed exactly as ``xbench`` does (for
scripts and tests; the CLI itself composes through ``@hydra.main``).

A researcher's own folders of configs (``XBENCH_CONF=/path/myconf``, an ``os.pathsep``-separated
list; or ``xbench --config-dir /path/myconf``, ``-cd``, which :mod:`xformer_bench.cli` moves into
``XBENCH_CONF``) hold studies, presets and options in the layout of conf/
(``myconf/experiment/my_study.yaml``, ``myconf/model/my_preset.yaml``,
``myconf/attention/my_option.yaml``).  They are searched here, in one place, by every part of
xbench: Hydra's composition (a search-path plugin, :func:`register_user_conf`, that every
``initialize_conf`` and the CLI's ``@hydra.main`` see) and the lookups that read YAML files
themselves (:func:`find_config`, :func:`options`, :func:`choice_groups`).

Precedence is Hydra's: conf/ is the primary config folder and a searched folder comes after it,
so of two files at one path the package's would win; xbench refuses that instead
(:func:`check_user_conf`: rename yours).  Between the user folders, the first listed wins.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from xformer_bench.resolvers import register as _register_resolvers

_register_resolvers()  # before anything composes conf/ (its YAMLs use ${vaswani_lr:...})

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
USER_CONF = "XBENCH_CONF"
"""The environment variable naming the user's config folders (``os.pathsep``-separated)."""
CONFIG_DIR_FLAGS = ("--config-dir", "-cd")
"""Hydra's flag for one more config folder: read into :data:`USER_CONF` by the CLI."""


def user_conf_dirs() -> tuple[Path, ...]:
    """The folders :data:`USER_CONF` lists, in its order, absolute (existing or not)."""
    listed = os.environ.get(USER_CONF, "").split(os.pathsep)
    return tuple(dict.fromkeys(Path(p).expanduser().resolve() for p in listed if p.strip()))


def config_dirs() -> tuple[Path, ...]:
    """Where a config is looked for, in Hydra's order: conf/ (the primary folder), then each
    existing user folder (:func:`user_conf_dirs`)."""
    return (CONF_DIR, *(d for d in user_conf_dirs() if d.is_dir() and d != CONF_DIR))


def find_config(group: str, name: str) -> Path | None:
    """The file of option ``name`` of ``group`` (``conf/<group>/<name>.yaml`` or a user
    folder's) that Hydra composes, or None when no folder has it."""
    for folder in config_dirs():
        path = folder / group / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def options(group: str) -> list[str]:
    """The options of ``group`` in every config folder, sorted."""
    return sorted({p.stem for folder in config_dirs() for p in (folder / group).glob("*.yaml")})


def config_groups() -> set[str]:
    """The top-level config groups: the folders holding YAMLs, in any config folder."""
    return {p.name for folder in config_dirs() for p in folder.iterdir()
            if p.is_dir() and any(p.glob("*.yaml"))}


class LazyOptions(Sequence):
    """:func:`options` of a group, read when used (a user folder may be named after import)."""

    def __init__(self, group: str) -> None:
        self.group = group

    def __getitem__(self, index):  # type: ignore[override]
        return tuple(options(self.group))[index]

    def __len__(self) -> int:
        return len(options(self.group))

    def __iter__(self) -> Iterator[str]:
        return iter(options(self.group))

    def __contains__(self, value: object) -> bool:
        return isinstance(value, str) and find_config(self.group, value) is not None

    def __repr__(self) -> str:
        return f"options({self.group!r})"


def check_user_conf() -> None:
    """:class:`~xformer_bench.errors.ConfigError` (one line) for a user folder that is not
    there, or holds a file at a path of conf/'s (Hydra would read the package's and ignore it)."""
    from xformer_bench.errors import ConfigError

    for folder in user_conf_dirs():
        if folder == CONF_DIR:
            continue
        if not folder.is_dir():
            raise ConfigError(f"config folder {folder} ({USER_CONF} or --config-dir) is not a "
                              "folder: create it, or name an existing one")
        for path in sorted(folder.rglob("*.yaml")):
            relative = path.relative_to(folder)
            if (CONF_DIR / relative).is_file():
                raise ConfigError(f"{path} has the name of xbench's conf/{relative.as_posix()}, "
                                  "which is read first (yours would be ignored): rename yours, "
                                  f"e.g. {relative.with_stem('my_' + relative.stem).as_posix()}")


def take_config_dirs(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``argv``'s ``--config-dir X`` / ``-cd X`` / ``--config-dir=X`` folders, and ``argv``
    without them; ConfigError for a flag without its folder."""
    from xformer_bench.errors import ConfigError

    folders, rest, arguments = [], [], list(argv)
    while arguments:
        arg = arguments.pop(0)
        flag, equals, value = arg.partition("=")
        if flag not in CONFIG_DIR_FLAGS:
            rest.append(arg)
            continue
        if not equals:
            if not arguments or arguments[0].startswith("-"):
                raise ConfigError(f"{flag} needs a folder: {flag} /path/myconf")
            value = arguments.pop(0)
        folders.append(value)
    return folders, rest


def add_user_conf(folders: Sequence[str]) -> None:
    """Put ``folders`` (absolute) in front of :data:`USER_CONF`, so that this process and
    every process it starts search them."""
    if folders:
        listed = [str(Path(f).expanduser().resolve()) for f in folders]
        previous = os.environ.get(USER_CONF, "")
        os.environ[USER_CONF] = os.pathsep.join([*listed, *([previous] if previous else [])])


@contextmanager
def user_conf(folders: Sequence[str]) -> Iterator[None]:
    """:func:`add_user_conf` for the block only."""
    previous = os.environ.get(USER_CONF)
    add_user_conf(folders)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(USER_CONF, None)
        else:
            os.environ[USER_CONF] = previous


def register_user_conf() -> None:
    """Make Hydra search the user folders after conf/ (a ``SearchPathPlugin``, read each time
    Hydra builds its search path: ``@hydra.main``, ``initialize_config_dir``)."""
    from hydra.core.plugins import Plugins

    Plugins.instance().register(_user_search_path())


def _user_search_path() -> type:
    global _SEARCH_PATH_PLUGIN
    if _SEARCH_PATH_PLUGIN is None:
        from hydra.plugins.search_path_plugin import SearchPathPlugin

        class UserConfSearchPath(SearchPathPlugin):
            """The folders of ``XBENCH_CONF``, after conf/ (Hydra's place for ``--config-dir``
            and ``hydra.searchpath``)."""

            def manipulate_search_path(self, search_path) -> None:
                for folder in config_dirs()[1:]:
                    search_path.append(provider="xbench-user-conf", path=f"file://{folder}")

        UserConfSearchPath.__module__ = __name__
        UserConfSearchPath.__qualname__ = "UserConfSearchPath"
        _SEARCH_PATH_PLUGIN = UserConfSearchPath
    return _SEARCH_PATH_PLUGIN


_SEARCH_PATH_PLUGIN: type | None = None


def __getattr__(name: str) -> Any:
    """``UserConfSearchPath``, the plugin class, made when first asked for (Hydra is imported
    only then; a launcher that pickles Hydra's plugins finds it by this name)."""
    if name == "UserConfSearchPath":
        return _user_search_path()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def initialize_conf():
    """Hydra initialised on conf/ and the user folders (a context manager)."""
    from hydra import initialize_config_dir

    register_user_conf()
    return initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3")

NOT_CHOICES = ("hydra", "experiment", "sparse_pattern", "study_rows")
"""Folders of conf/ that are not a run's choice: Hydra's own settings, study declarations, a
study's settings per row (``study_rows/<study>/<attention>.yaml``, picked by the experiment
and attention choices), and pointers a dataset sets for a preset (``sparse_pattern``: its
effect is the attention choice)."""
PLUMBING_GROUPS = ("data", "trainer", "logger")
"""Choices that do not shape the model: the dataset (a table column), how it trains and logs."""
CANONICAL_ORDER = ("model", "attention", "norm", "activation", "position", "ffn")
"""Display order of the groups named here; any other group follows, alphabetically."""


def group_order(group: str) -> tuple[int, str]:
    """Sort key: :data:`CANONICAL_ORDER` first, any other group after, alphabetically."""
    known = CANONICAL_ORDER.index(group) if group in CANONICAL_ORDER else len(CANONICAL_ORDER)
    return known, group


def choice_groups() -> tuple[str, ...]:
    """Every config group a run chooses an option of -- the one list records, run ids, W&B and
    tables use: the folders of conf/ (and of a user folder) less :data:`NOT_CHOICES`,
    model-shaping groups first (:data:`CANONICAL_ORDER`, then any new one), then
    :data:`PLUMBING_GROUPS`.  A new group is one new folder of YAMLs; nothing else lists it."""
    folders = config_groups()
    shaping = sorted(folders - set(NOT_CHOICES) - set(PLUMBING_GROUPS), key=group_order)
    return (*shaping, *(g for g in PLUMBING_GROUPS if g in folders))


def compose_config(*overrides: str) -> dict[str, Any]:
    """The resolved config (a plain dict) the CLI would build for ``overrides``; inside a
    running ``xbench`` job, composed by that job's Hydra."""
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    if GlobalHydra.instance().is_initialized():
        cfg = compose(config_name="config", overrides=list(overrides))
    else:
        with initialize_conf():  # read now
            cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


def flatten(node: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"d_model": 128}}`` -> ``{"model.d_model": 128}`` (an empty node stays a
    leaf, ``{}``: a key with no settings is not a key that is absent)."""
    flat: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
