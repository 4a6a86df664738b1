"""``python -m draftsmith`` = the ``draftsmith`` command."""

from draftsmith.cli import main

main()
