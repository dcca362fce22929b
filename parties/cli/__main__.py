"""`python -m parties.cli`: the `dpagg` command."""

from . import main

raise SystemExit(main())
