"""Every touch of Ray's private machinery, one small module each, each saying why no public API
serves and checking, before it relies on it, that the pinned Ray still has what it touches; each
has a canary unit test against that Ray (tests/unit/test_ray_ext_canaries.py).

- `serve_details`: replicas per deployment (running, target, settling) for edge-control, read
  as plain JSON; `serve.status()` is the fallback (slow in the caller, no targets).
- `serve_status`: Serve's public `serve.status()`, made safe to call from several threads.
- `router_metrics`: the cold-start push at zero replicas carries the request that queued.
- `raylet`: the raylet's PrestartWorkers / GetNodeStats RPCs, for the warm worker pool.
- `worker_setup`: the worker setup hook's variable and the module a Serve replica imports first.
- `driver`: a benchmark driver's token reload and `serve deploy`'s code path.
- `haproxy_front`: where Serve's HAProxy config of a node is, its binary, and the copy of that
  config a second HAProxy (the front spare) runs on the same port.
"""
