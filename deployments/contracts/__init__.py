"""What crosses a Ray call between the router, the model replicas and the control plane:
wire types, replies, and per deployment a Protocol with a thin typed client."""
