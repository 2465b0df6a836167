"""The examples in docs/testing.md run and fail where the page says they do."""

import ast
import pathlib
import re

import pytest

from offpolicy_ac import losses
from offpolicy_ac import testing

PAGE = pathlib.Path(__file__).parents[2] / "docs" / "testing.md"
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)


def _block(defines):
  (block,) = [b for b in BLOCKS if f"def {defines}(" in b]
  return block


def test_custom_target_and_the_bug_only_one_variant_shows():
  namespace = {}
  exec(compile(_block("lambda_return"), str(PAGE), "exec"), namespace)  # runs the five checks
  for statement in ast.parse(_block("lambda_return_times_mask")).body:
    code = compile(ast.Module([statement], []), str(PAGE), "exec")
    source = ast.unparse(statement)
    if source == "testing.assert_masked_steps_ignored(lambda_return_times_mask)":
      with pytest.raises(
          AssertionError, match=r"chex variant without_jit, nan garbage .* got np.float64\(nan\)"
      ):
        exec(code, namespace)
    else:
      exec(code, namespace)


@pytest.mark.parametrize(
    "check", ["assert_gradient_reaches_predictions", "assert_truncation_bootstraps"]
)
def test_the_example_call_of_a_check_passes(check):
  (block,) = [b for b in BLOCKS if b.startswith(f"testing.{check}(")]
  exec(compile(block, str(PAGE), "exec"), {"losses": losses, "testing": testing})
