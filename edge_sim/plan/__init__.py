"""The capacity planner: a discrete-event simulation, on a virtual clock and without Ray, of a
traffic trace through the router's own routing code and a model of Serve's autoscaler."""
