"""Import a script of the repository (bench/, native/fuzz/, the table generators) that is not
part of an installed package, as a module, by its path."""

import importlib.util
from pathlib import Path
from types import ModuleType


def load_script(path: Path) -> ModuleType:
    """The module that executing ``path`` defines, named after its file stem. Raises
    FileNotFoundError when ``path`` does not exist, and whatever the script raises on import."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
