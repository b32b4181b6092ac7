"""A node's Prometheus metrics, in a registry of its own (two nodes in one process, as the tests
run them, count apart). The names are a contract: dashboards and alerts depend on them.

Counted where the fact is committed, never before: a send counts once its result's group commit
returned, so after a drain the nodes' ``senddock_sends_total`` equals the attempts the database
recorded, outcome by outcome.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from senddock import __version__

# Relays answer in milliseconds to seconds; a claim in milliseconds.
SEND_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class NodeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._sends_by: dict[tuple[str, str], Counter] = {}  # (transport, outcome): its child of `sends`
        self.sends = Counter("senddock_sends", "Send results committed, by transport and outcome "
                             "(sent, retry, bounce, fail, pause, throttled).", ["transport", "outcome"],
                             registry=self.registry)
        self.send_duration = Histogram("senddock_send_duration_seconds", "How long send_message took.",
                                       ["transport"], buckets=SEND_BUCKETS, registry=self.registry)
        self.claim_duration = Histogram("senddock_claim_duration_seconds", "How long a claim statement took.",
                                        buckets=CLAIM_BUCKETS, registry=self.registry)
        self.in_flight = Gauge("senddock_sends_in_flight", "Jobs marked begun and not yet recorded on this node: "
                               "sends in flight, the senders' next jobs, results not committed yet.",
                               registry=self.registry)
        self.in_doubt = Counter("senddock_in_doubt", "Jobs this node's recovery found in doubt (they may "
                                "have gone out twice).", registry=self.registry)
        self.webhook_events = Counter("senddock_webhook_events", "Webhook events this node POSTed, by endpoint id "
                                      "and outcome (delivered, failed: to be retried, dead).", ["endpoint", "outcome"],
                                      registry=self.registry)
        self.failover_window = Gauge("senddock_failover_window_seconds", "recovery.failover_window: how long this "
                                     "node remembers the results it committed, to commit them again if a failover "
                                     "loses them.", registry=self.registry)
        self.replication_lag = Gauge("senddock_replication_lag_seconds", "The longest flush lag of the standbys "
                                     "streaming from the database this node uses (pg_stat_replication; NaN when it "
                                     "has none, or the role may not read it: grant pg_monitor). Above "
                                     "senddock_failover_window_seconds, a failover can lose what no node remembers.",
                                     registry=self.registry)
        self.replication_lag.set(float("nan"))
        self.database_wait = Gauge("senddock_database_wait_seconds", "How long this node's oldest claim, group "
                                   "commit (results) or heartbeat in progress has waited (0: none in progress). "
                                   "Normally milliseconds; see database.stuck_after.", ["statement"],
                                   registry=self.registry)
        self.pruned_rows = Counter("senddock_pruned_rows", "Rows this node's retention pruned, by table "
                                   "(ended broadcasts' detail, inbound mail records, status history).", ["table"],
                                   registry=self.registry)
        self.info = Gauge("senddock_node_info", "This node: its name and senddock's version (always 1).",
                          ["node", "version"], registry=self.registry)

    def name_node(self, node: str) -> None:
        self.info.clear()
        self.info.labels(node=node, version=__version__).set(1)

    def count_in_flight(self, read: Callable[[], int]) -> None:
        self.in_flight.set_function(read)

    def sent(self, transport: str, outcome: str) -> None:
        # labels() costs more than the count itself (once per send): its child is kept.
        child = self._sends_by.get((transport, outcome))
        if child is None:
            child = self._sends_by[(transport, outcome)] = self.sends.labels(transport=transport, outcome=outcome)
        child.inc()
