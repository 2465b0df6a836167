"""The `>>>` examples in the kit's docstrings run."""

import doctest

import pytest

from offpolicy_ac.testing import checks
from offpolicy_ac.testing import trajectories


@pytest.mark.parametrize("module", [checks, trajectories], ids=lambda m: m.__name__)
def test_docstring_examples_run(module):
  result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
  assert result.attempted > 0 and result.failed == 0, result
