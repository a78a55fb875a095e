"""``python -m pion`` is the ``pion`` command."""

from pion.cli import main

main()
