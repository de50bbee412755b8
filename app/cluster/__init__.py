"""Scale-out on Ray: one WHIP ingress placing each session on a Ray node that runs a full synchrony server.

``node`` (the per-node server, a Ray actor), ``placement`` (which node takes the next session),
``registry`` (finding nodes, starting their servers, watching their readiness and death),
``aggregate`` (the cluster's /metrics and /metrics/lst from the nodes'), ``ingress`` (the HTTP front).
See docs/SCALING.md.
"""
