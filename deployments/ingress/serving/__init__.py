"""The router's services: admission, moderation gate, cache, edge dispatch and accounting for each
API call. They take plain values and a `RequestContext`, never an HTTP request, so unit tests drive
them with fake handles; `deployments.ingress.api` puts them behind routes."""
