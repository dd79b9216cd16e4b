"""The base layer: errors, the stage data types, component options, output paths, checks of
untrusted numbers, stop signals, progress display and the content-addressed build cache.
Imports nothing else of ditto_core (docs/ARCHITECTURE.md)."""
