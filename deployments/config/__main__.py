"""`python -m deployments.config [serve_config.yaml]`: check a config file before deploying it."""

import sys

from deployments.config.serve_file import main

sys.exit(main())
