"""Registration into both OpenMMLab scopes, and mmrobust's own.

mmdet and mmseg each have their own child registries (``mmdet::model``, ``mmseg::model``, ...) and a
lookup never searches a sibling scope, so every mmrobust module is registered in both: a config
that imports mmrobust (``custom_imports``) names them plainly (``type='OverlappedTestLoop'``).
mmrobust's own registries (scope ``mmrobust``, children of mmengine's, as mmdet's and mmseg's are)
hold them too, so that any mmdet / mmseg config can name one with its scope
(``test_cfg = dict(type='mmrobust.OverlappedTestLoop')``): mmengine imports this module and, from
it, mmrobust. Use the objects here exactly like mmengine registries::

    from mmrobust.registry import MODELS

    @MODELS.register_module()
    class FANHybrid(BaseModule): ...
"""
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

from mmdet import registry as det_registry
from mmengine import registry as root_registry
from mmengine.registry import Registry
from mmseg import registry as seg_registry

__all__ = ['MODELS', 'HOOKS', 'TRANSFORMS', 'DATASETS', 'METRICS', 'OPTIM_WRAPPERS',
           'OPTIM_WRAPPER_CONSTRUCTORS', 'LOOPS', 'SCOPES', 'registered_modules']

SCOPES = ('mmdet', 'mmseg')


class ScopedRegistries:
    """Registers a module into the same-named registry of every scope in :data:`SCOPES`.

    And into mmrobust's own (:attr:`own`, scope ``mmrobust``, a child of mmengine's root registry
    of that name), from which a scoped name (``mmrobust.OverlappedTestLoop``) is built.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        root = getattr(root_registry, name)
        # NOTE: mmengine imports ``mmrobust.registry`` for a ``mmrobust.`` name, then the
        # locations, which register every module
        self.own = Registry(root.name, parent=root, scope='mmrobust', locations=['mmrobust'])
        self.registries: Tuple[Registry, ...] = (getattr(det_registry, name),
                                                 getattr(seg_registry, name), self.own)
        self.modules: Dict[str, Type] = {}

    def register_module(self, name: Optional[str] = None, force: bool = False,
                        module: Optional[Type] = None) -> Callable:
        def _register(cls: Type) -> Type:
            for registry in self.registries:
                registry.register_module(name=name, force=force, module=cls)
            self.modules[name or cls.__name__] = cls
            return cls

        return _register(module) if module is not None else _register

    def build(self, cfg: dict) -> Any:
        """Build a module registered here (from the current scope's registry)."""
        return self.registries[0].build(cfg)

    def __repr__(self) -> str:
        return f'ScopedRegistries({self.name}: {sorted(self.modules)})'


MODELS = ScopedRegistries('MODELS')
HOOKS = ScopedRegistries('HOOKS')
TRANSFORMS = ScopedRegistries('TRANSFORMS')
DATASETS = ScopedRegistries('DATASETS')
METRICS = ScopedRegistries('METRICS')
OPTIM_WRAPPERS = ScopedRegistries('OPTIM_WRAPPERS')
OPTIM_WRAPPER_CONSTRUCTORS = ScopedRegistries('OPTIM_WRAPPER_CONSTRUCTORS')
LOOPS = ScopedRegistries('LOOPS')


def registered_modules() -> List[Tuple[str, str, Any]]:
    """(registry name, module name, class) for everything mmrobust registered."""
    registries = (MODELS, HOOKS, TRANSFORMS, DATASETS, METRICS, OPTIM_WRAPPERS,
                  OPTIM_WRAPPER_CONSTRUCTORS, LOOPS)
    return [(reg.name, key, cls) for reg in registries for key, cls in reg.modules.items()]
