"""The node's HTTP endpoints on ``metrics.listen``: ``/metrics`` (Prometheus text format),
``/healthz`` (the process answers) and ``/readyz`` (database reachable, schema current, lifeline
held: 503 with the reasons otherwise). A thread of its own; each request in a thread too, so a
slow readiness check never delays a scrape."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

Readiness = Callable[[], list[str]]  # the reasons it is not ready; empty when it is


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass  # one line per scrape would drown the node's log


class HealthServer:
    def __init__(self, host: str, port: int, registry: CollectorRegistry, readiness: Readiness) -> None:
        metrics = make_wsgi_app(registry)

        def app(environ, start_response) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                return metrics(environ, start_response)
            if path == "/healthz":
                return _reply(start_response, "200 OK", {"status": "ok"})
            if path == "/readyz":
                problems = readiness()
                status = "503 Service Unavailable" if problems else "200 OK"
                return _reply(start_response, status, {"status": "not ready" if problems else "ready",
                                                       "problems": problems})
            return _reply(start_response, "404 Not Found", {"error": "not found: /metrics, /healthz, /readyz"})

        self._server = make_server(host, port, app, server_class=_Server, handler_class=_Quiet)
        self._thread = threading.Thread(target=self._server.serve_forever, name="senddock-metrics", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _reply(start_response, status: str, body: dict) -> list[bytes]:
    data = json.dumps(body).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]
