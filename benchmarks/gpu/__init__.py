"""The GPU decode check (`benchmarks/gpu/check.sh`): not a suite of `make bench`, which runs on
the CPU; run it on a machine with an NVIDIA GPU."""
