"""``GET /metrics`` of `senddock serve`: the cluster's figures (senddock.observe.cluster_metrics).

`serve` is usually reachable from the internet (it answers unsubscribe links), and the figures
name campaigns and their sizes: /metrics answers only clients in ``serve.metrics.allow`` (the
loopback by default) or presenting ``Authorization: Bearer <serve.metrics.token>``, 403 otherwise.
Behind a reverse proxy on the same host, the proxy must pass X-Forwarded-For (uvicorn believes it
from 127.0.0.1), or every client would look local.
"""

from __future__ import annotations

import hmac
import ipaddress

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from senddock.config import Config
from senddock.store.db import Database
from senddock.observe.cluster_metrics import ClusterCollector


def metrics_endpoint(config: Config, db: Database):
    settings = config.serve.metrics
    allowed = [ipaddress.ip_network(network, strict=False) for network in settings.allow]
    token = settings.token
    registry = ClusterCollector(config, db, min_interval=settings.min_interval).registry()

    def trusted(request: Request) -> bool:
        if token:
            scheme, _, presented = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token.encode()):
                return True
        try:
            client = ipaddress.ip_address(request.client.host if request.client else "")
        except ValueError:  # not an address (a Unix socket, a test client)
            return False
        return any(client in network for network in allowed)

    async def metrics(request: Request) -> Response:
        if not trusted(request):
            return PlainTextResponse("forbidden: /metrics answers the networks in serve.metrics.allow, "
                                     "or a bearer token (serve.metrics.token)\n", status_code=403)
        body = await run_in_threadpool(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST, headers={"Cache-Control": "no-store"})

    return metrics
