"""Operator tools for ray-edge-ai: the `edge` command, the load tester, a local cluster."""
