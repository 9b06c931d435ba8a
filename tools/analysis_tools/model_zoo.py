"""The model zoo: every configs/*/metafile.yml entry, measured, and results checked against it.

    python tools/analysis_tools/model_zoo.py                       # the table of all entries
    python tools/analysis_tools/model_zoo.py --task segmentation --family fan
    python tools/analysis_tools/model_zoo.py --check work_dirs/x/robustness_fan_coco_c.json
    python tools/analysis_tools/model_zoo.py --measure configs/fan/segformer_fan-t-hybrid_*.py
    python tools/analysis_tools/model_zoo.py --measure all --update    # refresh the metafiles
    python tools/analysis_tools/model_zoo.py --readme fan --update  # configs/fan/README.md's table

The table lists name, parameters, FLOPs at the test size, the papers' published numbers and the
config; --task and --family (config folder or collection, e.g. fan, swin, drvit, dat) filter it.
--check compares a tools/test_robustness.py results file with the published target of the
config it was computed with ("COCO box AP: P_clean 41.9 vs published 42.0"). --measure builds
configs and prints their parameters and FLOPs (one test-mode forward at the entry's ``FLOPs
Input``, counted as tools/analysis_tools/benchmark_backbones.py counts: 2 FLOPs per
multiply-add, attention included) next to what the metafile says; --update writes them in.
"""
import sys
from pathlib import Path

# the mmrobust of this checkout, not whichever one is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mmrobust.utils.errors import UsageError, run_tool
from mmrobust.utils.origin import report_origin

report_origin(__file__)

import argparse
import os.path as osp

from mmrobust.apis.model_zoo import (
    build_zoo_model,
    check_results,
    count_parameters,
    load_zoo,
    measure_flops,
    readme_rows,
    select,
    update_metadata,
    update_readme,
    zoo_table,
)

REPO = str(Path(__file__).resolve().parents[2])


def main() -> int:
    """List, check or measure the zoo; the exit status."""
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0], epilog=__doc__.split('\n\n', 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--task', default='',
                        help='only entries whose task contains this (e.g. detection)')
    parser.add_argument('--family', default='',
                        help='only entries whose config folder or collection contains this '
                        '(e.g. fan, swin, drvit, dat)')
    parser.add_argument('--readme', metavar='FOLDER',
                        help="print the table of configs/FOLDER/README.md (its entries, in "
                        'metafile order)')
    parser.add_argument('--check', nargs='+', metavar='RESULTS',
                        help='results JSON files of tools/test_robustness.py')
    parser.add_argument('--measure', nargs='+', metavar='CONFIG',
                        help='configs (with a zoo entry) to build and measure; `all` for '
                        'every entry')
    parser.add_argument('--update', action='store_true',
                        help='with --measure: write the measured numbers into the metafiles; '
                        "with --readme: write the table into the folder's README.md")
    args = parser.parse_args()
    entries = load_zoo(REPO)
    if args.check:
        from mmrobust.evaluation.report import load_results
        for path in args.check:
            entry, lines = check_results(load_results(path), entries, path)
            print(f'{path} ({entry.name}, {entry.config}):')
            print('\n'.join(f'  {line}' for line in lines))
        return 0
    if args.measure:
        by_config = {osp.normpath(e.config): e for e in entries}
        configs = list(by_config) if args.measure == ['all'] else args.measure
        for config in configs:
            rel = osp.normpath(osp.relpath(osp.abspath(osp.join(REPO, config)), REPO))
            entry = by_config.get(rel)
            if entry is None:
                raise UsageError(f'{config}: no model-zoo entry (add one to its folder\'s '
                                 'metafile.yml)')
            model = build_zoo_model(osp.join(REPO, rel))  # once, for both figures
            params, trainable = count_parameters(model)
            flops = measure_flops(model, entry.input_size)
            listed = (entry.params, entry.metadata['Trainable Parameters'], entry.flops)
            print(f'{entry.name}:  # metafile: {listed[0]} / {listed[1]} / {listed[2]}\n'
                  f'      Parameters: {params}\n      Trainable Parameters: {trainable}\n'
                  f'      FLOPs: {flops}', flush=True)
            if args.update:
                update_metadata(osp.join(REPO, entry.metafile), entry.name,
                                {'Parameters': params, 'Trainable Parameters': trainable,
                                 'FLOPs': flops})
        return 0
    chosen = select(entries, args.task, args.family)
    if not chosen:
        raise UsageError(
            f'no model-zoo entry matches --task {args.task!r} --family {args.family!r}; '
            f'tasks: {sorted({e.task for e in entries})}, families: '
            f'{sorted({e.folder for e in entries} | {e.collection for e in entries})}')
    if args.readme:
        rows = readme_rows([e for e in chosen if e.folder == args.readme])
        if len(rows) == 2:
            raise UsageError(f'configs/{args.readme}/ has no model-zoo entries; folders: '
                             f'{sorted({e.folder for e in entries})}')
        print('\n'.join(rows))
        if args.update:
            update_readme(osp.join(REPO, 'configs', args.readme, 'README.md'), args.readme, rows)
        return 0
    print(zoo_table(chosen))
    print(f'\n{len(chosen)} of {len(entries)} models; published numbers are the papers\', '
          'not reproduced here')
    return 0


if __name__ == '__main__':
    run_tool(main)
