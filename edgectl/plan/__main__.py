import sys

from edgectl.plan.cli import main

sys.exit(main())
