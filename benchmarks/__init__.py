"""Benchmarks of the serving stack, run by `python -m benchmarks.run` (`make bench`): one module or
package per suite, named by the figures it measures, on the shared library benchmarks.lib; never
collected by pytest. benchmarks/README.md says what each suite measures."""
