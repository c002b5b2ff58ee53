"""The router process: HTTP routes, services, edge dispatch, response cache, security and
gateway state. It reaches the other processes only through `deployments.contracts`."""
