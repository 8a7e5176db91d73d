"""``python -m streamgauge``: the same CLI as the ``streamgauge`` console script."""

from streamgauge.cli import main

raise SystemExit(main())
