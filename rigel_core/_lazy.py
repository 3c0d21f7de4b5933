"""Names of a package imported on first use (PEP 562): ``rigel_core.train``, ``rigel_core.io`` and
``rigel_core.renderer`` export names whose modules import torch, beside torch-free modules the viewer loads before
``import torch`` (its first frame); and the old paths of modules that moved (:class:`MovedModules`)."""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util


def lazy_names(package: str, table: dict, namespace: dict):
    """The ``(__getattr__, __dir__)`` of ``package`` (its ``__name__``) whose name N is
    ``package.<table[N]>.N``, imported on first use and then kept in ``namespace`` (the package's globals); an
    unknown name is an AttributeError."""

    def __getattr__(name):
        if name in table:
            value = getattr(importlib.import_module(f".{table[name]}", package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Old module paths of a package kept importable after their modules moved: ``package.<old>`` imports the
    module ``package.<table[old]>`` itself (the same object: a patch through either name is seen by both, and its
    classes keep their one ``__module__``). Put first in ``sys.meta_path`` by the package; it
    answers only the old names of its table."""

    def __init__(self, package: str, table: dict):
        self.package, self.table = package, table

    def find_spec(self, fullname, path=None, target=None):
        parent, _, name = fullname.rpartition(".")
        if parent != self.package or name not in self.table:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(f"{self.package}.{self.table[spec.name.rpartition('.')[2]]}")
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module):
        # the import system has just set the module's __spec__ to the old name's: give it its own back
        module.__spec__ = module.__spec__.loader_state
