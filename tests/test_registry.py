"""``import mmrobust`` registers modules in both scopes.

Lookup errors name the scope and close matches.
"""
import pytest
import torch.nn as nn
from mmdet.registry import MODELS as DET_MODELS
from mmengine.config import Config
from mmengine.model import BaseModule
from mmengine.registry import init_default_scope
from mmseg.registry import MODELS as SEG_MODELS

import mmrobust
from mmrobust.registry import MODELS, registered_modules
from mmrobust.utils import (
    MissingCustomImportsError,
    RegistryLookupError,
    check_custom_imports,
    explain_registry_errors,
)


@pytest.fixture(scope='module')
def probe_module():
    @MODELS.register_module(force=True)
    class MmrobustProbeBackbone(BaseModule):
        def __init__(self, width: int = 4) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, width, 1)

    return MmrobustProbeBackbone


def test_every_mmrobust_module_is_in_both_scopes(probe_module):
    modules = registered_modules()
    assert ('MODELS', 'MmrobustProbeBackbone', probe_module) in modules
    for reg_name, name, cls in modules:
        reg = getattr(mmrobust.registry, reg_name)
        for scoped in reg.registries:
            assert scoped.get(name) is cls, f'{name} missing from {scoped.scope}::{scoped.name}'


def test_built_from_mmdet_and_mmseg_scopes(probe_module):
    for scope, registry in (('mmdet', DET_MODELS), ('mmseg', SEG_MODELS)):
        init_default_scope(scope)
        model = registry.build(dict(type='MmrobustProbeBackbone', width=3))
        assert isinstance(model, probe_module) and model.conv.out_channels == 3


def test_typo_lists_close_matches_and_scope():
    init_default_scope('mmdet')
    with pytest.raises(RegistryLookupError) as info:
        with explain_registry_errors():
            DET_MODELS.build(dict(type='ResNe', depth=18))
    msg = str(info.value)
    assert "'ResNe' is not registered in the mmdet::model registry" in msg
    assert 'ResNet' in msg


def test_module_from_other_scope_is_pointed_out():
    init_default_scope('mmdet')
    with pytest.raises(RegistryLookupError, match=r"type='mmseg\.MixVisionTransformer'"):
        with explain_registry_errors():
            DET_MODELS.build(dict(type='MixVisionTransformer'))


def test_mmrobust_name_typo_mentions_custom_imports(probe_module):
    init_default_scope('mmseg')
    with pytest.raises(RegistryLookupError, match="custom_imports = dict"):
        with explain_registry_errors():
            SEG_MODELS.build(dict(type='MmrobustProbeBackbon'))


def test_missing_custom_imports_names_the_modules(probe_module):
    cfg = Config(dict(default_scope='mmdet', model=dict(
        type='MaskRCNN', backbone=dict(type='MmrobustProbeBackbone'))))
    with pytest.raises(MissingCustomImportsError, match='MmrobustProbeBackbone') as info:
        check_custom_imports(cfg)
    assert "custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)" in str(
        info.value)
    cfg.custom_imports = dict(imports=['mmrobust'], allow_failed_imports=False)
    check_custom_imports(cfg)


def test_unrelated_key_errors_pass_through():
    with pytest.raises(KeyError, match='plain'):
        with explain_registry_errors():
            raise KeyError('plain')


def test_cpu_amp_wrapper_autocasts_to_bfloat16():
    import torch

    from mmrobust.engine import CPUAmpOptimWrapper
    model = nn.Linear(4, 4)
    wrapper = CPUAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with wrapper.optim_context(model):
        out = model(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    wrapper.update_params(out.float().sum())
    assert model.weight.dtype == torch.float32
