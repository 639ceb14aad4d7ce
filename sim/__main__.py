"""``python -m sim`` is the same as the ``llmsim`` command."""

from sim.cli import main

raise SystemExit(main())
