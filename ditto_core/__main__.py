"""``python -m ditto_core``: the ``ditto`` command (for an environment without the console
script, e.g. a venv made with ``--system-site-packages``)."""

from ditto_core.cli.main import main

main()
