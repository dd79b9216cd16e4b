"""The ``ditto`` command line: ``cli.main`` (the click group, entry point ``main``),
``cli.cc`` (``ditto cc``), ``cli.eval`` (``bench``, ``eval``, ``compare``, ``calibrate``...),
``cli.serve`` (``ditto serve``) and ``cli.common`` (what they share)."""
