"""Checks that turn common config mistakes into errors a user can act on.

- a dataset root that does not exist names the path and says how to generate or prepare it;
- a type name that is not registered names the scope and registry and lists close matches;
- a config that uses mmrobust modules without ``custom_imports`` says what to add.
"""
import contextlib
import difflib
import importlib
import os.path as osp
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

import mmengine.registry as mme_registry
from mmengine.config import Config
from mmengine.logging import print_log
from mmengine.registry import Registry

from .errors import ConfigError, InputNotFoundError, UsageError

__all__ = ['DatasetNotFoundError', 'RegistryLookupError', 'MissingCustomImportsError',
           'check_dataset_paths', 'check_custom_imports', 'explain_registry_errors',
           'explain_registry_error', 'config_scope', 'leaf_datasets', 'resolve_config_path']

CUSTOM_IMPORTS_LINE = "custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)"


class DatasetNotFoundError(InputNotFoundError):
    """A dataset file or folder named by the config does not exist."""


class RegistryLookupError(UsageError, LookupError):
    """A ``type=`` name was not found in the registry of the config's scope.

    A config mistake: a usage error, exit status 2.
    """


class MissingCustomImportsError(ConfigError):
    """The config uses mmrobust modules but does not import mmrobust (exit status 2)."""


def config_scope(cfg: Config) -> str:
    """The OpenMMLab scope a config runs in (``mmdet`` or ``mmseg``)."""
    scope = cfg.get('default_scope')
    if scope not in ('mmdet', 'mmseg'):
        raise ValueError(
            f"config has default_scope={scope!r}; mmrobust's tools run 'mmdet' (detection) and "
            "'mmseg' (segmentation) configs. Inherit from an mmdet:: or mmseg:: base config, or "
            "set default_scope.")
    return scope


# -- dataset paths ---------------------------------------------------------------------------------
def leaf_datasets(ds: Any) -> List[Dict]:
    """The innermost dataset configs of a dataset config.

    Through wrappers (``dataset=``, e.g. RepeatDataset, MultiImageMixDataset) and concatenations
    (``datasets=[...]``).

    They are the config's own dicts, so changes to them change the config.
    """
    if not isinstance(ds, dict):
        return []
    if isinstance(ds.get('dataset'), dict):
        return leaf_datasets(ds['dataset'])
    if 'datasets' in ds:
        return [leaf for sub in ds['datasets'] for leaf in leaf_datasets(sub)]
    return [ds]


#: ``data_prefix`` keys of images, which every dataset reads
_IMAGE_PREFIXES = ('img', 'img_path')


def _reads_label_maps(ds: Dict, scope: Optional[str]) -> bool:
    """Whether the dataset's pipeline opens the files of its other ``data_prefix`` keys.

    A segmentation (or panoptic) map is opened by mmseg's ``LoadAnnotations``, mmdet's with
    ``with_seg=True`` and ``LoadPanopticAnnotations``; an mmdet instance config that inherits
    a panoptic base's ``seg`` prefix never opens it. Without a pipeline: assumed to.
    """
    pipeline = ds.get('pipeline')
    if not pipeline:
        return True
    for step in pipeline:
        kind = step.get('type', '') if isinstance(step, dict) else type(step).__name__
        kind = kind if isinstance(kind, str) else getattr(kind, '__name__', '')
        step_scope, _, name = kind.rpartition('.')
        if name == 'LoadPanopticAnnotations' and step.get('with_seg', True):
            return True
        if name == 'LoadAnnotations' and ((step_scope or scope) == 'mmseg'
                                           or step.get('with_seg', False)):
            return True
    return False


def _dataset_paths(ds: Dict, scope: Optional[str] = None) -> List[Tuple[str, bool]]:
    """``(path, opened)`` of a dataset config: ``opened`` False for a prefix nothing reads."""
    root = ds.get('data_root') or ''
    paths = [(root, True)] if root else []
    ann = ds.get('ann_file')
    if ann:
        paths.append((ann if osp.isabs(ann) else osp.join(root, ann), True))
    labels = _reads_label_maps(ds, scope)
    for key, value in (ds.get('data_prefix') or {}).items():
        if isinstance(value, str) and value:
            paths.append((value if osp.isabs(value) else osp.join(root, value),
                          key in _IMAGE_PREFIXES or labels))
    return paths


def resolve_config_path(name: str) -> str:
    """A config's file: a path, or mmengine's package form found in the installed package.

    ``mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py`` is the file under the package's
    ``.mim/configs`` (where mmdet and mmseg wheels ship their zoo).

    Raises:
        InputNotFoundError: no such file, package or package config.
    """
    if '::' not in name:
        if not osp.isfile(name):
            raise InputNotFoundError(
                f'config {name} does not exist (resolved from {osp.abspath(".")}): give a path, '
                "or a package's config as mmengine names it, e.g. "
                'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py')
        return name
    package, _, relative = name.partition('::')
    try:
        module = importlib.import_module(package)
    except ImportError:
        raise InputNotFoundError(f'config {name}: the package {package!r} is not installed') \
            from None
    folder = osp.join(osp.dirname(module.__file__), '.mim', 'configs')
    path = osp.join(folder, relative)
    if not osp.isfile(path):
        raise InputNotFoundError(f'config {name}: {package} has no config {relative} (its '
                                 f'configs are under {folder})')
    return path


def check_dataset_paths(cfg: Config, loaders: List[str]) -> None:
    """Raise :class:`DatasetNotFoundError` if a dataset of ``loaders`` points to missing files.

    Args:
        cfg: The full config.
        loaders: Dataloader keys to check, e.g. ``['train_dataloader', 'val_dataloader']``.
    """
    for key in loaders:
        loader = cfg.get(key)
        if not loader:
            continue
        for ds in leaf_datasets(loader.get('dataset')):
            if ds.get('backend_args') is not None:
                continue  # remote storage: nothing to check locally
            for path, opened in _dataset_paths(ds, cfg.get('default_scope')):
                if '://' in path or osp.exists(path):
                    continue
                if not opened:  # NOTE: a prefix the pipeline never opens: no reason to refuse
                    print_log(f'{key}: {path!r} does not exist; not needed, as the pipeline '
                              'loads no segmentation map from it', logger='current')
                    continue
                root = ds.get('data_root') or osp.dirname(path)
                hint = ('it is mmrobust\'s toy data: generate it with '
                        '`python data/generate_toy_data.py`' if 'toy_' in path else
                        'see data/README.md for how to download and lay out COCO 2017 and '
                        'Cityscapes (including the *_labelTrainIds.png labels)')
                raise DatasetNotFoundError(
                    f'{key}: the {ds.get("type", "dataset")} at data_root={root!r} is missing '
                    f'{path!r} (resolved from {osp.abspath(".")}). {hint[0].upper()}{hint[1:]}; '
                    f'or point the config at your copy with '
                    f'`--cfg-options {key}.dataset.data_root=/path/to/data/`.')


# -- registries ------------------------------------------------------------------------------------
_NOT_IN_REGISTRY = re.compile(r'`?([\w.]+)`? is not in the (\w+)::([\w ]+?) registry')


def _root_registries() -> Dict[str, Registry]:
    return {reg.name: reg for reg in vars(mme_registry).values() if isinstance(reg, Registry)}


def _names_in(registry: Registry) -> List[str]:
    names = set(registry.module_dict)
    parent = registry.parent
    while parent is not None:
        names |= set(parent.module_dict)
        parent = parent.parent
    return sorted(names)


def explain_registry_error(exc: BaseException) -> Optional[str]:
    """A helpful message for mmengine's "X is not in the scope::name registry", else None."""
    match = _NOT_IN_REGISTRY.search(str(exc))
    if match is None:
        return None
    name, scope, reg_name = match.groups()
    root = _root_registries().get(reg_name)
    scoped = root.children.get(scope) if root is not None else None
    candidates = _names_in(scoped) if scoped is not None else []
    close = difflib.get_close_matches(name.split('.')[-1], candidates, n=5, cutoff=0.6)
    lines = [f'{name!r} is not registered in the {scope}::{reg_name} registry (a config\'s '
             f'`type` names are looked up in its default_scope, here {scope!r}).']
    lines.append(f'Close matches: {", ".join(close)}.' if close else
                 'No registered name is close to it.')
    from mmrobust.registry import registered_modules
    ours = {name for _, name, _ in registered_modules()}
    if name in ours or any(c in ours for c in close):
        lines.append(f'mmrobust modules are registered by importing mmrobust: make sure the '
                     f'config has `{CUSTOM_IMPORTS_LINE}`.')
    if root is not None:
        others = [s for s, child in root.children.items()
                  if s != scope and name in child.module_dict]
        if others:
            lines.append(f'{name!r} exists in the {", ".join(others)} scope; write '
                         f"type='{others[0]}.{name}' to use it from a {scope} config.")
    return ' '.join(lines)


@contextlib.contextmanager
def explain_registry_errors() -> Iterator[None]:
    """Re-raise registry lookup failures inside the block with :func:`explain_registry_error`."""
    try:
        yield
    except KeyError as exc:
        message = explain_registry_error(exc)
        if message is None:
            raise
        raise RegistryLookupError(message) from exc


def _config_types(obj: Any) -> Iterator[str]:
    if isinstance(obj, dict):
        if isinstance(obj.get('type'), str):
            yield obj['type']
        for value in obj.values():
            yield from _config_types(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _config_types(value)


def check_custom_imports(cfg: Config) -> None:
    """Refuse a config that names mmrobust modules but does not import mmrobust.

    Without ``custom_imports`` such a config only works by accident (when something else imported
    mmrobust first) and fails in mmdet's/mmseg's own tools, so the mistake is caught here.
    """
    from mmrobust.registry import registered_modules
    ours = {name for _, name, _ in registered_modules()}
    # NOTE: a name scoped ``mmrobust.`` makes mmengine import mmrobust itself
    used = sorted({t.split('.')[-1] for t in _config_types(cfg.to_dict())
                   if not t.startswith('mmrobust.')} & ours)
    imports = (cfg.get('custom_imports') or {}).get('imports', [])
    imports = [imports] if isinstance(imports, str) else list(imports)
    if used and not any(i == 'mmrobust' or i.startswith('mmrobust.') for i in imports):
        raise MissingCustomImportsError(
            f'the config uses mmrobust modules ({", ".join(used)}) but does not import mmrobust, '
            f'so they are not registered in the {cfg.get("default_scope")} scope. Add this line '
            f'to the config: {CUSTOM_IMPORTS_LINE}')
