"""The plugin kit, what a third-party plugin imports: the hook marker (``kit.hookspecs``), the
component protocols (``kit.components``), the quantizer kit (``kit.quantkit``) with bit
allocation (``kit.allocate``) and importance records (``kit.importance``). It loads neither the
command line, nor the pipeline, nor evaluation, nor torch (.importlinter "kit")."""
