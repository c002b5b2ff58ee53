"""Simulated global edge network: colos, geography, latency, health and routing (plain Python)."""
