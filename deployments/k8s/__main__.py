import sys

from deployments.k8s.cli import main

sys.exit(main())
