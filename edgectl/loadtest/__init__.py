"""Open-loop load generator for the router: seeded scenarios, per-request records with the edge
headers, Ray Serve replica sampling, and a report (summary.json, requests.csv, plots, report.md).

Run it with `python -m edgectl.loadtest --scenario steady --url http://127.0.0.1:8000 --out DIR`.
"""
