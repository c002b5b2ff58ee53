"""Benchmarks of the serving stack, run by `python -m benchmarks.run` (`make bench`): one module or
package per suite, named by the figures it measures, on the shared library benchmarks.lib; never
collected by pytest. benchmarks/README.md says what each suite measures."""

import os

# Every suite attaches to its private cluster with ray.init and detaches before stopping it. A
# Serve handle the driver used keeps a thread polling Serve's controller; after the detach, its
# next call would attach again on its own (Ray's auto-connect, through RAY_ADDRESS), and when the
# cluster then stops, Ray ends this whole process (its core worker exits when its raylet dies)
# before the report is printed. Ray reads this once, when it is first imported: here, first.
os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
