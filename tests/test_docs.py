"""Every documented command names a real tool and only options its --help lists.

The documentation works: every ``python tools/...`` and ``bash tools/...`` command in README.md,
docs/ and the other READMEs names a tool that exists and only options its --help lists (nothing runs
for real: each tool's --help runs in this process), and every relative link and image resolves,
anchors included.
"""
import ast
import functools
import re
import shlex
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

from helpers import REPO, run_tool_in_process

PAGES = [REPO / 'README.md', REPO / 'CONTRIBUTING.md', REPO / 'data' / 'README.md',
         *sorted((REPO / 'configs').glob('*/README.md')), *sorted((REPO / 'docs').rglob('*.md'))]
# shell launchers whose extra arguments are those of a Python tool
LAUNCHES = {'dist_train.sh': 'train.py', 'slurm_train.sh': 'train.py',
            'dist_test.sh': 'test.py', 'slurm_test.sh': 'test.py'}
COMMAND = re.compile(r'(?<![\w/$.-])(python|bash) +(tools/[\w/.-]+)(.*)')
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)|<img [^>]*src="([^"]+)"')


def _logical_lines(text: str) -> List[str]:
    """The page's lines with backslash continuations joined.

    And each inline code span of a prose line on its own (a command in a table or a sentence ends at
    its backtick).
    """
    joined, out, fenced = text.replace('\\\n', ' ').split('\n'), [], False
    for line in joined:
        if line.lstrip().startswith('```'):
            fenced = not fenced
            continue
        out.extend([line] if fenced else re.findall(r'`([^`]+)`', line))
    return out


def commands(page: Path) -> List[Tuple[str, List[str], str]]:
    """Every command of the page with the tool whose --help lists its arguments.

    (tool path, its arguments, the Python tool whose --help lists them or '' for a shell script's
    own) for every command of the page.
    """
    found = []
    for line in _logical_lines(page.read_text()):
        for m in COMMAND.finditer(line):
            rest = re.split(r'&&|\|\||[|;#]', m.group(3))[0]
            try:
                args = shlex.split(rest.replace('[', ' ').replace(']', ' '))
            except ValueError:  # an unbalanced quote in prose: take the words as they are
                args = rest.split()
            tool, target = m.group(2), m.group(2)
            if tool.endswith('.sh'):  # a launcher runs train.py / test.py, or TOOL=...
                chosen = re.search(r'TOOL=(\S+)\s+$', line[:m.start()])
                name = LAUNCHES.get(Path(tool).name)
                target = f'tools/{chosen.group(1) if chosen else name}' if name else ''
            found.append((tool, args, target))
    return found


@functools.lru_cache(maxsize=None)
def help_text(tool: str, sub: str = '') -> str:
    """What ``python tools/TOOL [SUB] --help`` prints, run in this process."""
    return run_tool_in_process(tool[len('tools/'):], *([sub] if sub else []), '--help')[1]


def _options(args: List[str]) -> Set[str]:
    return {a.split('=', 1)[0] for a in args if a.startswith('--') and len(a) > 2}


def _all_commands() -> Dict[str, List[Tuple[str, List[str]]]]:
    return {p.relative_to(REPO).as_posix(): commands(p) for p in PAGES}


def test_the_pages_have_commands():
    found = _all_commands()
    assert sum(len(v) for v in found.values()) > 50
    assert {'README.md', 'docs/en/get_started.md'} <= set(found)


@pytest.mark.parametrize('page', [p.relative_to(REPO).as_posix() for p in PAGES])
def test_every_command_names_a_tool_and_its_options(page):
    problems = []
    for tool, args, target in commands(REPO / page):
        if not (REPO / tool).is_file() or (target and not (REPO / target).is_file()):
            problems.append(f'{tool} ({target}): no such tool')
            continue
        options = _options(args)
        if not options:
            continue
        if not target:  # a shell script's own options: its text names them
            text = (REPO / tool).read_text()
            problems += [f'{tool} {o}: not an option of the script' for o in options
                         if o not in text]
            continue
        tool = target
        listed = help_text(tool)
        if args and re.fullmatch(r'[a-z_]+', args[0]) and f'{args[0]}' in listed:
            listed += help_text(tool, args[0])  # a subcommand's own options
        problems += [f'python {tool} ... {o}: not in its --help' for o in sorted(options)
                     if not re.search(rf'(?<![\w-]){re.escape(o)}(?![\w-])', listed)]
    assert not problems, f'{page}:\n' + '\n'.join(problems)


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r'[`*_]|\[([^\]]*)\]\([^)]*\)', r'\1', heading.strip().lower())
    return re.sub(r'[^\w\- ]', '', text).replace(' ', '-')


def anchors(page: Path) -> Set[str]:
    found, fenced = set(), False
    for line in page.read_text().split('\n'):
        if line.lstrip().startswith('```'):
            fenced = not fenced
        elif not fenced and re.match(r'#{1,6} ', line):
            found.add(_slug(line.lstrip('#')))
    return found


@pytest.mark.parametrize('page', [p.relative_to(REPO).as_posix() for p in PAGES])
def test_every_link_resolves(page):
    path, problems = REPO / page, []
    for m in LINK.finditer(path.read_text()):
        target = m.group(1) or m.group(2)
        if re.match(r'[a-z]+:', target):
            continue  # https:, mailto:
        file, _, anchor = target.partition('#')
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            problems.append(f'{target}: {dest.relative_to(REPO.resolve())} does not exist'
                            if dest.is_relative_to(REPO.resolve()) else f'{target}: outside')
        elif anchor and dest.suffix == '.md' and anchor not in anchors(dest):
            problems.append(f'{target}: no heading with anchor #{anchor}')
    assert not problems, f'{page}:\n' + '\n'.join(problems)


def test_the_checker_catches_what_it_should(tmp_path):
    """A wrong option, a missing tool and a broken anchor are found."""
    page = tmp_path / 'p.md'
    page.write_text('```bash\npython tools/test.py CFG CKPT --no-such-flag \\\n  --tta\n'
                    'bash tools/dist_train.sh CFG 8 --amp   # a comment --not-an-option\n```\n'
                    'Run `python tools/nope.py --x` or see [x](#missing).\n# Title\n')
    found = commands(page)
    assert found == [('tools/test.py', ['CFG', 'CKPT', '--no-such-flag', '--tta'], 'tools/test.py'),
                     ('tools/dist_train.sh', ['CFG', '8', '--amp'], 'tools/train.py'),
                     ('tools/nope.py', ['--x'], 'tools/nope.py')]
    listed = help_text('tools/test.py')
    assert '--tta' in listed and '--no-such-flag' not in listed
    assert anchors(page) == {'title'} and _slug(' Checkpoints on torch ≥ 2.6') == \
        'checkpoints-on-torch--26'


def test_the_front_page_is_short_and_links_every_page():
    readme = REPO / 'README.md'
    text = readme.read_text()
    assert len(text.splitlines()) <= 180
    linked = {(readme.parent / (m.group(1) or m.group(2)).partition('#')[0]).resolve()
              for m in LINK.finditer(text)}
    missing = [p.relative_to(REPO).as_posix() for p in sorted((REPO / 'docs').rglob('*.md'))
               if p.resolve() not in linked]
    assert not missing, f'README.md does not link {missing}'


def test_the_sources_of_the_protocols_and_counts_are_named():
    """The guide cites its sources and says which protocol each table used.

    Cityscapes-C's origin (Kamann & Rother) and the robustness analyses the analysis tools follow
    (Paul & Chen) are cited; FAN's parameter counts are called the released code's, not the paper's;
    the guide says which protocol each published table used.
    """
    readme = (REPO / 'README.md').read_text()
    assert '@article{kamann2021benchmarking' in readme and 'Kamann, Christoph' in readme
    assert '@inproceedings{paul2022vision' in readme and 'Vision Transformers are Robust' in readme
    fan = (REPO / 'configs' / 'fan' / 'README.md').read_text()
    assert "counts are the paper's" not in fan and "the released code's models" in fan
    guide = (REPO / 'docs' / 'en' / 'user_guides' / 'robustness_benchmarking.md').read_text()
    section = guide[guide.index('## Comparing with published numbers'):]
    for protocol in ('`benchmark`', '`fan_coco_c`', '`fan_city_c`', '`cityscapes_c`'):
        assert protocol in section.split('\n\n', 3)[2], protocol


# inline code in a docstring is RST's literal (double backticks); a single backtick pair is RST's
# "interpreted text" (a role such as :func:`x` takes one pair, and is what the lookbehind allows)
SINGLE_BACKTICKS = re.compile(r'(?<![`:\w\\])`(?!`)[^`\n]+`(?![`_\w])')


def single_backtick_spans(source: str) -> List[Tuple[int, str]]:
    """``(line, span)`` of every single-backtick span in the docstrings of ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False) or ''
            found += [(node.body[0].lineno, m.group(0)) for m in SINGLE_BACKTICKS.finditer(doc)]
    return found


def test_docstrings_mark_code_with_double_backticks():
    """One backtick style (CONTRIBUTING.md): ``code`` in every docstring of the project."""
    files = [p for d in ('mmrobust', 'tools', 'tests') for p in sorted((REPO / d).rglob('*.py'))]
    offenders = [f'{p.relative_to(REPO)}:{line}: {span}' for p in files
                 for line, span in single_backtick_spans(p.read_text())]
    assert not offenders, 'single backticks (write ``code``):\n' + '\n'.join(offenders)
    # the check itself: a single pair is caught, a double pair and a role are not
    sample = 'def f():\n    """Takes `x`, returns ``y`` via :func:`g`."""\n'
    assert single_backtick_spans(sample) == [(2, '`x`')]
