"""Example third-party Ditto plugin: one replacement component for each of the seven stages.

Each is registered under its own name, so a build uses it only when named (``--exporter
test-ditto``, ``--quantizer test-identity``, ``--packer test-f32``, ``--emitter test-clang``,
``--pass count-loops``, ``--linker test-clang``, ``--blas test-openblas``); a build with any one
of them in place of Ditto's default still runs end to end (tests/test_plugin_stages.py).
"""

from ditto_core.kit.hookspecs import hookimpl

from .blas import ScipyOpenBlas
from .compile import ClangLinker, CountLoopsPass, PlainClangEmitter
from .model import DittoFileExporter, F32Packer, IdentityQuantizer

__all__ = ["ClangLinker", "CountLoopsPass", "DittoFileExporter", "F32Packer",
           "IdentityQuantizer", "PlainClangEmitter", "ScipyOpenBlas"]


@hookimpl
def register_exporters(register):
    register(DittoFileExporter())


@hookimpl
def register_quantizers(register):
    register(IdentityQuantizer())


@hookimpl
def register_packers(register):
    register(F32Packer())


@hookimpl
def register_emitters(register):
    register(PlainClangEmitter())


@hookimpl
def register_passes(register):
    register(CountLoopsPass())


@hookimpl
def register_linkers(register):
    register(ClangLinker())


@hookimpl
def register_blas(register):
    register(ScipyOpenBlas())
