"""The ``serve`` section, typed: where `senddock serve` listens, what one client may make it hold,
the SNS webhook's trust, /metrics and the dashboard's account.

Secrets (the metrics token, the admin's password hash and session key) are kept out of each repr.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from senddock.durations import parse_duration
from senddock.sizes import parse_size


@dataclass(frozen=True)
class ServeMetricsSettings:
    allow: tuple[str, ...]  # networks answered without the token
    token: str | None = field(repr=False)
    min_interval: float


@dataclass(frozen=True)
class AdminSettings:
    username: str
    password_hash: str = field(repr=False)
    session_lifetime: float
    session_secret: str | None = field(repr=False)  # None: a random key per process
    max_verifying: int


@dataclass(frozen=True)
class ServeSettings:
    host: str
    port: int
    tls_cert_file: str | None  # as written: relative to the config's folder
    tls_key_file: str | None
    max_body: int  # bytes
    body_timeout: float
    header_timeout: float
    max_connections: int
    max_connections_per_client: int
    trusted_proxies: tuple[str, ...]
    keep_alive_timeout: float
    sns_certificate_timeout: float
    sns_certificates: Mapping[str, str]  # SigningCertURL -> PEM file as written
    sns_topic_arns: tuple[str, ...]
    metrics: ServeMetricsSettings
    admin: AdminSettings | None  # None: no dashboard


def serve_settings(section: Mapping[str, Any]) -> ServeSettings:
    metrics, admin = section["metrics"], section["admin"]
    return ServeSettings(
        host=section["host"], port=section["port"],
        tls_cert_file=section["tls_cert_file"], tls_key_file=section["tls_key_file"],
        max_body=parse_size(section["max_body"]), body_timeout=parse_duration(section["body_timeout"]),
        header_timeout=parse_duration(section["header_timeout"]), max_connections=section["max_connections"],
        max_connections_per_client=section["max_connections_per_client"],
        trusted_proxies=tuple(section["trusted_proxies"]),
        keep_alive_timeout=parse_duration(section["keep_alive_timeout"]),
        sns_certificate_timeout=parse_duration(section["sns_certificate_timeout"]),
        sns_certificates=dict(section["sns_certificates"]), sns_topic_arns=tuple(section["sns_topic_arns"]),
        metrics=ServeMetricsSettings(allow=tuple(metrics["allow"]), token=metrics["token"],
                                     min_interval=parse_duration(metrics["min_interval"])),
        admin=None if admin is None else AdminSettings(
            username=admin["username"], password_hash=admin["password_hash"],
            session_lifetime=parse_duration(admin["session_lifetime"]), session_secret=admin["session_secret"],
            max_verifying=admin["max_verifying"]),
    )
