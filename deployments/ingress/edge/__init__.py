"""The router's edge layer. A request enters at its nearest colo (simulated: client->colo RTT from
geography) and is served by a region: one real replica pool per model and region.

`calls` (a model call as a value, and the one place its errors become serving errors), `pools`
(each model's handle per region and the region state shared with edge-control), `dispatch`
(entry colo, region plan, RTT, call, failover), `trace` (where a request went: the x-edge-*
headers), `waiting` (a request's wait limits and the notice of a cold-start wait), `clock` (the
dispatcher's time, injected so its tests never sleep)."""
