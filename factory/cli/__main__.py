"""``python -m factory.cli``: the same entry point as the ``factory`` script."""

from factory.cli import main

main()
