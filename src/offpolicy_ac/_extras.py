"""Optional dependencies (the extras in pyproject.toml): import one, or raise an ImportError
that says what went wrong and the one command that fixes it."""

import importlib
import types


def missing(what: str, package: str, extra: str, error: Exception) -> ImportError:
  """The ImportError to raise when importing the optional `package`, which `what` needs,
  raised `error`: either `package` is not installed, or it is installed and its own import
  failed (`error` quoted: a dependency of its own missing, a version that does not fit).
  Both name the command that installs the extra `extra`."""
  fix = f"pip install 'offpolicy_ac[{extra}]'"
  if isinstance(error, ModuleNotFoundError) and error.name == package:
    return ImportError(f"{what} needs {package}, which is not installed: {fix}")
  return ImportError(
      f"{what} needs {package}, which is installed but fails to import "
      f"({type(error).__name__}: {error}). {fix} installs it with what it needs"
  )


def require(what: str, package: str, extra: str, module: str | None = None) -> types.ModuleType:
  """Imports `module` (default: `package`) of the optional `package`, or raises `missing`'s
  ImportError, chained to the original one."""
  try:
    importlib.import_module(package)  # a submodule already imported would skip this check
    return importlib.import_module(module or package)
  except Exception as e:  # pylint: disable=broad-except
    # Not only ImportError: an installed package whose import fails otherwise (protobuf's
    # "Descriptors cannot be created directly" is a TypeError) is quoted the same way.
    raise missing(what, package, extra, e) from e
