"""The metric a text replica reports to Serve's autoscaler and the policy in the controller reads
(Serve's custom autoscaling metrics: `record_autoscaling_stats`)."""

REQUESTS_METRIC = "requests_in_replica"  # the requests a replica holds, coalesced ones counted
