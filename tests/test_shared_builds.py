"""helpers.shared.build_once: built once for all the workers of a run, a failure not retried."""
import pytest

from helpers import shared


@pytest.fixture
def own_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(shared, 'SHARED_DIR', tmp_path / 'shared')
    return tmp_path / 'shared'


def test_a_build_runs_once_and_a_half_build_is_redone(own_folder):
    calls = []

    def build(path):
        calls.append(path)
        path.write_text('weights')
    first = shared.build_once('init.pth', build)
    assert shared.build_once('init.pth', build) == first and len(calls) == 1
    assert first.read_text() == 'weights'
    # killed half-way in an earlier worker: a target without its done marker is built again
    (own_folder / 'init.pth.done').unlink()
    first.write_text('half')
    shared.build_once('init.pth', build)
    assert len(calls) == 2 and first.read_text() == 'weights'


def test_a_failed_build_fails_the_next_asker_without_building_again(own_folder):
    calls = []

    def build(path):
        calls.append(path)
        path.mkdir()
        raise RuntimeError('training diverged')
    with pytest.raises(RuntimeError, match='diverged'):
        shared.build_once('trained', build)
    with pytest.raises(pytest.fail.Exception, match=r'(?s)failed in another worker.*diverged'):
        shared.build_once('trained', build)
    assert len(calls) == 1
