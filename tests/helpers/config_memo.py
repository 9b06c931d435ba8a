"""mmengine's two costs per config that the suite pays hundreds of times, paid once per text.

A pytest plugin (``pytest_plugins`` in ``tests/conftest.py``), for the tests' own process: the
tools that tests run in process build a Runner per run, and

* every ``Runner`` formats its config with yapf four times (the log, ``dump_config``,
  ``RuntimeInfoHook`` and the visualizer's ``add_config``): ~0.3-0.6 s each for a toy config on
  this machine, the same text each time;
* every ``mmdet::`` / ``mmseg::`` reference in a config (each toy config has two or three)
  parses all of the package's metafiles to learn that a ``_base_`` file has no metafile entry:
  ~0.4 s each.

Both are pure functions of their arguments and of the installed packages' files, which do not
change during a run: :func:`install` memoises them, so the text each test sees is the text
mmengine gives. Subprocesses (the tools' start-up, launchers, kills) run mmengine unchanged.
``tools/analysis_tools/suite_durations.py`` shows where the suite's time goes;
``MMROBUST_CONFIG_MEMO=0`` leaves mmengine as it is (to measure what this saves).
"""
import functools
import os
import os.path as osp
import warnings
from typing import Any, Dict, Tuple

import mmengine.config.config as config_module
import mmengine.config.utils as config_utils
from mmengine.fileio import load

_format_code = config_module.FormatCode
_metainfo = config_utils._get_cfg_metainfo


@functools.lru_cache(maxsize=256)
def _format(text: str, style: Tuple[Tuple[str, Any], ...]) -> Tuple[str, bool]:
    return _format_code(text, style_config=dict(style))


def format_code(text: str, style_config: Any = None, **kwargs: Any) -> Tuple[str, bool]:
    """yapf's ``FormatCode``, memoised on (text, style) for mmengine's call."""
    if kwargs or not isinstance(style_config, dict):
        return _format_code(text, style_config=style_config, **kwargs)
    return _format(text, tuple(sorted(style_config.items())))


@functools.lru_cache(maxsize=None)
def _package_configs(package_path: str, index_mtime: float) -> Dict[str, dict]:
    """Each config name of a package's model index -> its first metafile entry (mmengine's rule)."""
    index = load(osp.join(package_path, '.mim', 'model-index.yml'))
    configs: Dict[str, dict] = {}
    for meta_path in index['Import']:
        for model in load(osp.join(package_path, '.mim', meta_path))['Models']:
            if 'Config' not in model:
                warnings.warn(f'There is not `Config` define in {model}')
                continue
            configs.setdefault(model['Config'].partition('/')[-1], model)
    return configs


def cfg_metainfo(package_path: str, cfg_path: str) -> dict:
    """mmengine's ``_get_cfg_metainfo`` from a memoised index (ValueError where it has none)."""
    index = osp.join(package_path, '.mim', 'model-index.yml')
    configs = _package_configs(package_path, osp.getmtime(index))
    if cfg_path not in configs:
        # NOTE: mmengine lists every name here; its caller only catches the ValueError
        raise ValueError(f'Expected configs of {package_path}, but got {cfg_path}')
    return dict(configs[cfg_path])


def install() -> None:
    """Memoise both in this process (idempotent)."""
    config_module.FormatCode = format_code
    config_utils._get_cfg_metainfo = cfg_metainfo


def uninstall() -> None:
    """mmengine's own functions back."""
    config_module.FormatCode = _format_code
    config_utils._get_cfg_metainfo = _metainfo


if os.environ.get('MMROBUST_CONFIG_MEMO', '1') != '0':
    install()
