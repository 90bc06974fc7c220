"""The judge every test file here grades with: the local one, one per file, with two sandbox workers."""
import pytest

from minigrpo.judge import make_judge


@pytest.fixture(scope="module")
def judge():
    j = make_judge("local", workers=2)
    yield j
    j.close()
