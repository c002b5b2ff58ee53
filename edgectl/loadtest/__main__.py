"""`python -m edgectl.loadtest`: the same as `edge loadtest`."""

import sys

from edgectl.loadtest.cli import main

sys.exit(main())
