"""Simulated global edge network: colos, geography, latency, health and routing (plain Python).

A router holds one `edge_sim.network.EdgeNetwork(EdgeConfig)`; nothing here imports Ray or HTTP.
"""
