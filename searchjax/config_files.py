"""Config files that build on each other: `configs/eviback.py` starts from `configs/search_r1.py`, and so on.

ml-collections loads a config file by its path (`--config configs/eviback.py[:variant]`), not as a module of a
package, so a config cannot `import` its sibling; `sibling(__file__, name)` loads `<dir of __file__>/<name>.py`
by path instead, whatever the working directory.
"""

from __future__ import annotations

import importlib.util
import pathlib
import types


def sibling(config_file: str, name: str) -> types.ModuleType:
    """The module of the config file `name`.py next to `config_file` (a config's own `__file__`)."""
    path = pathlib.Path(config_file).resolve().with_name(f"{name}.py")
    if not path.is_file():
        raise FileNotFoundError(f"{config_file}: its sibling config {path} does not exist")
    spec = importlib.util.spec_from_file_location(f"searchjax_configs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
