"""Test methods for a target computed by the scan and by the associative scan."""

import chex


def scan_and_associative(check):
  """The two `chex.TestCase` test methods of `check(variant, method)`, named after it
  (`_check_x` gives `test_x_scan` and `test_x_associative`): the scan run both eagerly and
  jitted, the associative scan jitted only (eagerly its log-depth tree of small ops takes
  seconds). Bind them in a class body under those names:

      test_x_scan, test_x_associative = scan_and_associative(_check_x)
  """
  name = "test_" + check.__name__.removeprefix("_check_")

  def scan(self):
    check(self.variant, "scan")

  def associative(self):
    check(self.variant, "associative")

  scan.__name__ = scan.__qualname__ = f"{name}_scan"
  associative.__name__ = associative.__qualname__ = f"{name}_associative"
  both = chex.variants(with_jit=True, without_jit=True)(scan)
  return both, chex.variants(with_jit=True)(associative)
