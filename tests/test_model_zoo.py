"""The model zoo: every config folder's metafile.yml and README.md.

And tools/analysis_tools/model_zoo.py.

The parameter count of every entry whose config is a model config is checked where the config
is built anyway (tests/test_configs.py); the tokenizer recipes are built here.
"""
import json
import os.path as osp
import shutil

import pytest
import yaml

from mmrobust.apis.model_zoo import (
    METRICS,
    README_MARK,
    ZooError,
    build_zoo_model,
    check_results,
    count_parameters,
    load_zoo,
    measure_flops,
    readme_rows,
    readme_table,
    select,
    update_metadata,
    update_readme,
)

from helpers import ALL_CONFIGS, REPO, run_tool_in_process

ZOO_FOLDERS = ('fan', 'drvit', 'efficientdet', 'yolo', 'tokenizers')
ENTRIES = load_zoo(str(REPO))
# the papers' numbers, as ../shared/specs gives them: FAN's table (Cascade Mask R-CNN on COCO,
# the SegFormer head on Cityscapes) and DAT's detectors
PUBLISHED = {
    ('cascade-mask-rcnn_fan-t-hybrid_fpn_ms-3x_coco', 'COCO', 'box AP'): 50.2,
    ('cascade-mask-rcnn_fan-t-hybrid_fpn_ms-3x_coco', 'COCO-C', 'box mPC'): 33.1,
    ('cascade-mask-rcnn_fan-s-hybrid_fpn_ms-3x_coco', 'COCO', 'box AP'): 53.3,
    ('cascade-mask-rcnn_fan-s-hybrid_fpn_ms-3x_coco', 'COCO-C', 'box mPC'): 38.7,
    ('cascade-mask-rcnn_fan-b-hybrid_fpn_ms-3x_coco', 'COCO', 'box AP'): 54.2,
    ('cascade-mask-rcnn_fan-b-hybrid_fpn_ms-3x_coco', 'COCO-C', 'box mPC'): 40.6,
    ('cascade-mask-rcnn_fan-l-hybrid_fpn_ms-3x_coco', 'COCO', 'box AP'): 55.1,
    ('cascade-mask-rcnn_fan-l-hybrid_fpn_ms-3x_coco', 'COCO-C', 'box mPC'): 42.0,
    ('segformer_fan-t-hybrid_8xb1-160k_cityscapes-1024x1024', 'Cityscapes', 'mIoU'): 81.2,
    ('segformer_fan-t-hybrid_8xb1-160k_cityscapes-1024x1024', 'Cityscapes-C', 'mIoU mPC'): 57.1,
    ('segformer_fan-s-hybrid_8xb1-160k_cityscapes-1024x1024', 'Cityscapes', 'mIoU'): 81.5,
    ('segformer_fan-s-hybrid_8xb1-160k_cityscapes-1024x1024', 'Cityscapes-C', 'mIoU mPC'): 66.4,
    ('segformer_fan-b-hybrid_8xb1-160k_cityscapes-1024x1024', 'Cityscapes', 'mIoU'): 82.2,
    ('segformer_fan-b-hybrid_8xb1-160k_cityscapes-1024x1024', 'Cityscapes-C', 'mIoU mPC'): 66.9,
    ('segformer_fan-l-hybrid_8xb1-160k_cityscapes-1024x1024', 'Cityscapes', 'mIoU'): 82.3,
    ('segformer_fan-l-hybrid_8xb1-160k_cityscapes-1024x1024', 'Cityscapes-C', 'mIoU mPC'): 68.7,
    ('efficientdet-lite0_dat_8xb16-300e_coco', 'COCO', 'box AP'): 27.3,
    ('efficientdet-lite0_dat_8xb16-300e_coco', 'COCO-C', 'box mPC'): 17.89,
    ('efficientdet-lite0_dat_8xb16-300e_coco', 'COCO-C', 'box rPC'): 65.53,
    ('yolov3_d53_dat_8xb8-320-273e_coco', 'COCO-C', 'box mPC'): 20.55,
}
# every variant the papers report, with each dense head the zoo offers it
VARIANTS = (
    [f'{head}_fan-{v}-hybrid_{rest}' for v in 'tsbl' for head, rest in (
        ('mask-rcnn', 'fpn_ms-crop-3x_coco'), ('cascade-mask-rcnn', 'fpn_ms-3x_coco'),
        ('faster-rcnn', 'fpn_ms-3x_coco'), ('segformer', '8xb1-160k_cityscapes-1024x1024'),
        ('segformer', '8xb2-160k_ade20k-512x512'))]
    + [f'{head}_{family}-{v}_{rest}' for family, variants in (('fan-swin', 'tsb'),
                                                              ('drvit', ('ti', 's', 'b')))
       for v in variants for head, rest in (
           ('mask-rcnn', 'fpn_ms-crop-3x_coco' if family == 'fan-swin' else 'fpn_1x_coco'),
           ('segformer', '8xb1-160k_cityscapes-1024x1024'))]
    + ['efficientdet-lite0_8xb16-300e_coco', 'efficientdet-lite0_dat_8xb16-300e_coco',
       'yolov3_d53_8xb8-320-273e_coco', 'yolov3_d53_dat_8xb8-320-273e_coco'])


def test_every_config_of_a_zoo_folder_has_a_valid_entry_and_readme_row():
    listed = {osp.normpath(e.config) for e in ENTRIES}
    for folder in ZOO_FOLDERS:
        configs = {osp.normpath(osp.relpath(p, REPO))
                   for p in (REPO / 'configs' / folder).glob('*.py')}
        assert configs and configs <= listed, sorted(configs - listed)
        # the README's table is the metafile's, as the tool writes it
        readme = (REPO / 'configs' / folder / 'README.md').read_text()
        rows = readme_rows([e for e in ENTRIES if e.folder == folder])
        assert readme_table(readme, folder) == rows, f'configs/{folder}/README.md: run ' \
            f'python tools/analysis_tools/model_zoo.py --readme {folder} --update'
    names = {e.name for e in ENTRIES}
    assert set(VARIANTS) <= names, sorted(set(VARIANTS) - names)
    for e in ENTRIES:
        assert e.params > 0 and 0 < int(e.metadata['Trainable Parameters']) <= e.params, e.name
        assert e.flops > 0, e.name
        assert osp.splitext(osp.basename(e.config))[0] == e.name
    published = {(e.name, d, m): v for e in ENTRIES for d, m, v in e.published()}
    assert published == PUBLISHED


def test_parameters_of_entries_outside_the_model_configs():
    others = [e for e in ENTRIES if REPO / e.config not in ALL_CONFIGS]
    assert [e.folder for e in others] == ['tokenizers']
    for e in others:
        assert count_parameters(build_zoo_model(str(REPO / e.config))) == (
            e.params, int(e.metadata['Trainable Parameters']))


@pytest.mark.parametrize('name', ['efficientdet-lite0_8xb16-300e_coco', 'vq-small-f16_toy-coco'])
def test_flops_reproduce_the_metafile(name, in_repo):
    entry = next(e for e in ENTRIES if e.name == name)
    model = build_zoo_model(str(REPO / entry.config))
    assert measure_flops(model, entry.input_size) == entry.flops


def test_selection_by_task_and_family():
    seg = select(ENTRIES, task='segmentation', family='fan')
    assert seg and all(e.task == 'Semantic Segmentation' and e.folder == 'fan' for e in seg)
    assert {e.name for e in seg} >= {'segformer_fan-swin-t_8xb1-160k_cityscapes-1024x1024',
                                     'segformer_fan-l-hybrid_8xb2-160k_ade20k-512x512'}
    swin = select(ENTRIES, family='swin')
    assert {e.collection for e in swin} == {'FAN-Swin'} and len(swin) == 6
    dat = select(ENTRIES, family='dat')  # a collection, or a training technique
    assert {e.name for e in dat} == {e.name for e in ENTRIES if '_dat_' in e.name}
    assert {e.folder for e in dat} == {'fan', 'efficientdet', 'yolo'}
    assert {e.task for e in select(ENTRIES, family='tokenizers')} == {'Image Tokenization'}
    assert select(ENTRIES, task='classification') == []


def test_metafile_errors_name_the_entry(tmp_path):
    folder = tmp_path / 'configs' / 'x'
    folder.mkdir(parents=True)
    (folder / 'm.py').write_text('')
    head = 'Collections:\n  - Name: X\nModels:\n  - Name: m\n'
    meta = ('    Metadata:\n      Training Data: COCO\n      FLOPs Input: 8x8\n'
            '      Parameters: 1\n      Trainable Parameters: 1\n      FLOPs: 1\n')
    cases = [
        ('    In Collection: Y\n    Config: configs/x/m.py\n' + meta,
         r"x/metafile.yml: m: In Collection 'Y' is not one of the Collections \['X'\]"),
        ('    In Collection: X\n    Config: configs/x/n.py\n' + meta,
         'm: Config configs/x/n.py does not exist'),
        ('    In Collection: X\n    Config: configs/x/m.py\n',
         r"m: Metadata lacks \['Training Data'"),
        ('    In Collection: X\n    Config: configs/x/m.py\n' + meta + '    Results:\n'
         '      - Task: Object Detection\n        Dataset: COCO\n        Metrics:\n'
         '          box APP: 1.0\n', r"m: unknown metrics \['box APP'\]"),
        ('    In Collection: X\n    Config: configs/x/m.py\n' + meta + '    Results:\n'
         '      - Task: Object Detection\n        Dataset: VOC\n        Metrics:\n'
         '          box AP: 1.0\n', "m: Dataset 'VOC' is not one of"),
        ('    Config: configs/x/m.py\n' + meta, "lacks 'In Collection'"),
        ('    In Collection: X\n    Config: configs/x/m.py\n' + meta + '    Results:\n'
         '      - Task: Object Detection\n        Dataset: COCO\n        Metrics:\n'
         '          box AP: 1.0\n', r'm: an entry with published numbers says what its '
         r'backbone was pre-trained on \(Metadata.Pre-training\)'),
        ('    In Collection: X\n    Config: configs/x/m.py\n' + meta
         + '      Pre-training: ImageNet-1K\n      Robustness Protocol: benchmarkk\n'
         '    Results:\n      - Task: Object Detection\n        Dataset: COCO-C\n'
         '        Metrics:\n          box mPC: 1.0\n',
         r"m: a published corruption number needs the protocol it was measured on .*got "
         r"'benchmarkk'"),
    ]
    for body, message in cases:
        (folder / 'metafile.yml').write_text(head + body)
        with pytest.raises(ZooError, match=message):
            load_zoo(str(tmp_path))
    (folder / 'metafile.yml').write_text(
        head + '    In Collection: X\n    Config: configs/x/m.py\n' + meta + head[
            head.index('Models:') + 8:] + '    In Collection: X\n    Config: configs/x/m.py\n'
        + meta)
    with pytest.raises(ZooError, match=r"more than once in the metafiles: \['m'\]"):
        load_zoo(str(tmp_path))


def test_update_rewrites_one_entry_and_the_readme_table(tmp_path):
    metafile = tmp_path / 'metafile.yml'
    shutil.copy(REPO / 'configs' / 'yolo' / 'metafile.yml', metafile)
    before = metafile.read_text()
    update_metadata(str(metafile), 'yolov3_d53_dat_8xb8-320-273e_coco',
                    {'Parameters': 7, 'FLOPs': 9})
    after = yaml.safe_load(metafile.read_text())['Models']
    plain, dat = after
    assert dat['Metadata']['Parameters'] == 7 and dat['Metadata']['FLOPs'] == 9
    assert plain == yaml.safe_load(before)['Models'][0]  # the other entry is untouched
    assert dat['Metadata']['Trainable Parameters'] == yaml.safe_load(before)['Models'][1][
        'Metadata']['Trainable Parameters']
    assert metafile.read_text().count('#') == before.count('#')  # comments kept
    with pytest.raises(ZooError, match='no entry named nope'):
        update_metadata(str(metafile), 'nope', {'FLOPs': 1})
    with pytest.raises(ZooError, match=r"no Metadata lines for \['Weights'\]"):
        update_metadata(str(metafile), 'yolov3_d53_8xb8-320-273e_coco', {'Weights': 1})

    readme = tmp_path / 'README.md'
    mark = README_MARK.format('yolo')
    readme.write_text(f'# yolo\n\n{mark}\n| old |\n|---|\n| row |\n\nafter\n')
    update_readme(str(readme), 'yolo', ['| new |', '|---|'])
    assert readme.read_text() == f'# yolo\n\n{mark}\n| new |\n|---|\n\nafter\n'
    with pytest.raises(ZooError, match='has no line'):
        readme_table('# nothing\n', 'yolo')


def _results(config: str, clean: float, corrupted: float, protocol: str, **identity):
    """A results dict whose images were made as the published table's.

    A results dict, its images made as the protocol's published table made them unless ``identity``
    says otherwise.
    """
    from mmrobust.corruptions import PUBLISHED_SETUPS
    cells = {'clean': {'0': {'coco/bbox_mAP': clean, 'coco/segm_mAP': clean - .05}}}
    for c in ('gaussian_noise', 'fog'):
        cells[c] = {str(s): {'coco/bbox_mAP': corrupted, 'coco/segm_mAP': corrupted - .05}
                    for s in range(1, 6)}
    setup = PUBLISHED_SETUPS.get(protocol)
    made = {'bgr_compat': setup.bgr_compat, 'source': setup.source,
            'stored_set': {'lossless': False, 'jpeg_quality': setup.jpeg_quality}} if setup else {}
    return {'config': config, 'protocol': protocol, 'cells': cells, **made, **identity}


def test_results_are_checked_against_the_published_target(tmp_path):
    config = 'configs/fan/cascade-mask-rcnn_fan-s-hybrid_fpn_ms-3x_coco.py'
    entry, lines = check_results(_results(config, .419, .30, 'fan_coco_c'), ENTRIES)
    assert entry.config == config
    assert lines == ['COCO box AP: P_clean 41.9 vs published 53.3',
                     'COCO-C box mPC: mPC 30.0 vs published 38.7']
    _, lines = check_results(_results(config, .419, .30, 'benchmark'), ENTRIES)
    assert 'published on protocol fan_coco_c, these results are benchmark: not comparable' \
        in lines[1]
    # rPC in % of the clean score
    lite = 'configs/efficientdet/efficientdet-lite0_dat_8xb16-300e_coco.py'
    _, lines = check_results(_results(lite, .25, .15, 'benchmark'), ENTRIES)
    assert lines == ['COCO box AP: P_clean 25.0 vs published 27.3',
                     'COCO-C box mPC: mPC 15.0 vs published 17.89',
                     'COCO-C box rPC: rPC 60.0 vs published 65.53']
    _, lines = check_results(_results('configs/fan/faster-rcnn_fan-t-hybrid_fpn_ms-3x_coco.py',
                                      .3, .2, 'benchmark'), ENTRIES)
    assert lines == ['faster-rcnn_fan-t-hybrid_fpn_ms-3x_coco has no published numbers to '
                     'compare with']
    with pytest.raises(ZooError, match='no model-zoo entry'):
        check_results(_results('configs/toy/mask-rcnn_r18_fpn_toy-coco.py', .4, .3, 'x'),
                      ENTRIES)
    assert set(METRICS) >= {m for _, _, m in PUBLISHED}

    path = tmp_path / 'robustness.json'
    path.write_text(json.dumps(_results(config, .419, .30, 'fan_coco_c')))
    status, out, _ = _zoo_tool('--check', path)
    assert status == 0 and 'COCO box AP: P_clean 41.9 vs published 53.3' in out


def test_a_partial_results_file_is_not_compared():
    """1 of 80 cells done: the mPC line says so instead of 'mPC 30.0 vs published 38.7'."""
    from mmrobust.corruptions import get_protocol
    config = 'configs/fan/cascade-mask-rcnn_fan-s-hybrid_fpn_ms-3x_coco.py'
    results = _results(config, .419, .30, 'fan_coco_c')
    protocol = get_protocol('fan_coco_c')
    results['cells_planned'] = {c: list(s) for c, s in protocol.severities.items()}
    results['cells'] = {k: v for k, v in results['cells'].items() if k in ('clean', 'fog')}
    results['cells']['fog'] = {'1': results['cells']['fog']['1']}
    _, lines = check_results(results, ENTRIES)
    assert lines == ['COCO box AP: P_clean 41.9 vs published 53.3',
                     'COCO-C box mPC: not compared: 79 of 80 cells of fan_coco_c are missing (a '
                     'partial results file: finish the run) vs published 38.7']


def test_images_made_otherwise_than_published_are_named_with_the_flags():
    config = 'configs/fan/cascade-mask-rcnn_fan-s-hybrid_fpn_ms-3x_coco.py'
    _, lines = check_results(_results(config, .419, .30, 'fan_coco_c', bgr_compat=False,
                                      source='on-the-fly', stored_set=None), ENTRIES)
    assert lines[1].startswith('COCO-C box mPC: mPC 30.0 vs published 38.7 (not comparable: '
                               'colour order RGB, published BGR; images on-the-fly, published '
                               'stored; published: FAN')
    assert '--bgr-compat --jpeg-quality 95' in lines[1]
    _, lines = check_results(_results(config, .419, .30, 'fan_coco_c', stored_set={
        'lossless': True, 'jpeg_quality': None}), ENTRIES)
    assert 'stored lossless, published JPEG quality 95' in lines[1]


def _zoo_tool(*args):
    return run_tool_in_process('analysis_tools/model_zoo.py', *args)


def test_tool_prints_and_filters_the_zoo():
    status, out, _ = _zoo_tool()
    rows = [line for line in out.splitlines() if line.startswith('| ')][1:]
    assert status == 0 and len(rows) == len(ENTRIES)
    assert any('COCO-C box mPC 38.7' in r and 'cascade-mask-rcnn_fan-s-hybrid' in r for r in rows)
    _, out, _ = _zoo_tool('--task', 'detection', '--family', 'drvit')
    rows = [line for line in out.splitlines() if line.startswith('| ')][1:]
    assert sorted(r.split(' | ')[0][2:] for r in rows) == [
        f'mask-rcnn_drvit-{v}_fpn_1x_coco' for v in ('b', 's', 'ti')]
    status, _, err = _zoo_tool('--family', 'nothing')
    assert status == 2 and 'no model-zoo entry matches' in err
    status, out, _ = _zoo_tool('--readme', 'yolo')
    assert status == 0 and out.splitlines() == readme_rows(select(ENTRIES, family='yolo'))


def test_fans_cityscapes_c_targets_belong_to_fans_own_protocol():
    """FAN's City-C figures are attached to the protocol of its test_city_c.py.

    19 corruptions at severities 1-3 (its HEAD, b7ced45; the first release ran 1-5), its grouping
    (noise 4, blur 4, digital 4, weather 5 with brightness, zoom blur and elastic transform as
    ``extra``). Not to SegFormer's 16-corruption cityscapes_c.
    """
    from collections import Counter

    from mmrobust.corruptions import CORRUPTIONS, PROTOCOLS, PUBLISHED_SETUPS
    city = [e for e in ENTRIES if any(d == 'Cityscapes-C' for d, _, _ in e.published())]
    assert city and all(e.metadata['Robustness Protocol'] == 'fan_city_c' for e in city)
    fan = PROTOCOLS['fan_city_c']
    assert set(fan.corruptions) == set(CORRUPTIONS)
    assert set(fan.cells()) == {(c, s) for c in CORRUPTIONS for s in (1, 2, 3)}
    groups = {c: fan.category(c) for c in fan.corruptions}
    assert Counter(groups.values()) == {'noise': 4, 'blur': 4, 'digital': 4, 'weather': 5,
                                        'extra': 2}
    assert [groups[c] for c in ('zoom_blur', 'elastic_transform', 'brightness', 'pixelate')] == [
        'extra', 'extra', 'weather', 'digital']
    setup = PUBLISHED_SETUPS['fan_city_c']
    assert setup.bgr_compat and '*.jpg' in setup.origin and 'an inference' in setup.origin


def test_fans_coco_c_groups_four_per_category():
    """``dist_test_coco_c.sh`` lists brightness with contrast, saturate and JPEG."""
    from collections import Counter

    from mmrobust.corruptions import PROTOCOLS
    fan = PROTOCOLS['fan_coco_c']
    assert Counter(fan.category(c) for c in fan.corruptions) == {
        'noise': 4, 'blur': 4, 'weather': 4, 'digital': 4}
    assert fan.category('brightness') == 'digital'


def test_fan_city_cs_extra_corruptions_are_their_own_group_in_the_summary():
    from mmrobust.corruptions import PROTOCOLS
    from mmrobust.evaluation import robustness_summary
    fan = PROTOCOLS['fan_city_c']
    cells = {'clean': {0: {'mIoU': 80.0}}}
    for c, s in fan.cells():
        cells.setdefault(c, {})[s] = {'mIoU': 40.0 if fan.category(c) == 'extra' else 60.0}
    per_category = robustness_summary(cells, fan)['metrics']['mIoU']['per_category']
    assert per_category == {'noise': 60.0, 'blur': 60.0, 'weather': 60.0, 'digital': 60.0,
                            'extra': 40.0}


def test_published_numbers_say_how_they_were_measured_and_on_what_backbone():
    """Every published corruption number names its protocol's colour order and storage.

    One source: PUBLISHED_SETUPS. COCO numbers say box or mask, and FAN-L's row says that its
    published model was pre-trained otherwise than the weights its config loads.
    """
    from mmrobust.corruptions import PUBLISHED_SETUPS
    for e in (e for e in ENTRIES if e.results):
        assert e.metadata['Pre-training']
        for dataset, metric, _ in e.published():
            if dataset.startswith('COCO'):
                assert metric.split()[0] in ('box', 'mask'), (e.name, metric)
            setting = e.published_setting(dataset)
            if dataset.endswith('-C'):
                protocol = e.metadata['Robustness Protocol']
                assert setting.startswith(f'{protocol}, ')
                setup = PUBLISHED_SETUPS[protocol]
                assert ('BGR colour order' in setting) == setup.bgr_compat
                assert ('on the fly' in setting) == (setup.source == 'on-the-fly')
            else:
                assert setting == ''
    rows = {row.split(' | ')[0][2:]: row for row in readme_rows(ENTRIES)[2:]}
    large = rows['cascade-mask-rcnn_fan-l-hybrid_fpn_ms-3x_coco']
    assert ('COCO-C box mPC 42 (fan_coco_c, BGR colour order, stored as JPEG quality 95)'
            in large)
    assert 'published with ImageNet-1K' in large and 'in22k_1k' in large
    assert 'published with' not in rows['cascade-mask-rcnn_fan-b-hybrid_fpn_ms-3x_coco']
    assert ('COCO-C box mPC 17.89 (benchmark, BGR colour order, corrupted on the fly)'
            in rows['efficientdet-lite0_dat_8xb16-300e_coco'])


def test_fans_city_c_targets_are_compared_with_a_run_at_severities_1_to_3():
    """A complete fan_city_c run (19 corruptions x severities 1-3) is compared with FAN's 66.4."""
    from mmrobust.corruptions import PUBLISHED_SETUPS, get_protocol
    config = 'configs/fan/segformer_fan-s-hybrid_8xb1-160k_cityscapes-1024x1024.py'
    protocol = get_protocol('fan_city_c')
    setup = PUBLISHED_SETUPS['fan_city_c']
    cells = {'clean': {'0': {'mIoU': 80.0}}}
    for c, s in protocol.cells():
        cells.setdefault(c, {})[str(s)] = {'mIoU': 60.0}
    results = {'config': config, 'protocol': 'fan_city_c', 'cells': cells,
               'cells_planned': {c: list(s) for c, s in protocol.severities.items()},
               'bgr_compat': setup.bgr_compat, 'source': setup.source,
               'stored_set': {'lossless': True, 'jpeg_quality': None}}
    _, lines = check_results(results, ENTRIES)
    assert len(protocol.cells()) == 57
    assert lines == ['Cityscapes mIoU: P_clean 80.0 vs published 81.5',
                     'Cityscapes-C mIoU mPC: mPC 60.0 vs published 66.4'], lines
