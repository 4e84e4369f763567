"""``python -m attnbench``: the same as the ``attnbench`` command."""

from attnbench.cli import main

raise SystemExit(main())
