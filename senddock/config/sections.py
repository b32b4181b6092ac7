"""The validated configuration, typed: :class:`Config` and the settings of its sections."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from senddock.config.bounces import BouncesSettings, bounces_settings
from senddock.config.environment import ENV_CONFIG
from senddock.config.mail import (DkimSettings, TemplateSettings, UnsubscribeSettings, dkim_settings, template_settings,
                                  unsubscribe_settings)
from senddock.config.serve import ServeSettings, serve_settings
from senddock.durations import parse_duration
from senddock.pacing.limits import PacingSettings, pacing_settings
from senddock.redact import redact
from senddock.retry import RetrySettings, retry_settings

# Sends in flight per node when neither concurrency nor its former name workers is set.
DEFAULT_CONCURRENCY = 50
DEFAULT_CONFIG_PATHS = (Path("config/senddock.yaml"), Path("senddock.yaml"))


@dataclass(frozen=True)
class DatabaseSettings:
    dsn: str | None
    direct_dsn: str | None
    embedded_path: Path
    pool_size: int
    connect_timeout: float
    auto_migrate: bool
    result_commit: str = "async"
    pool_mode: str = "auto"  # what dsn reaches: auto, transaction (a pooler in transaction mode) or session
    stuck_after: float = 10.0  # a node's statement waiting longer is reported (senddock.core.waits)


@dataclass(frozen=True)
class BreakerSettings:
    bounce_rate: float
    bounce_window: int
    early_bounces: int
    early_window: int
    probe_interval: float
    probe_max_interval: float


@dataclass(frozen=True)
class RecoverySettings:
    heartbeat: float
    lease: float
    in_doubt: str
    max_rescues: int
    failover_window: float = 10.0


@dataclass(frozen=True)
class RetentionSettings:
    """How long per-recipient history is kept, in seconds; None: forever."""

    broadcasts: float | None
    inbound_mail: float | None
    campaign_events: float | None
    every: float


def _kept(value: str) -> float | None:
    return None if value == "forever" else parse_duration(value)


@dataclass(frozen=True)
class LoggingSettings:
    level: str
    format: str


@dataclass(frozen=True)
class MetricsSettings:
    listen: str | None  # host:port as written; None: a node serves no /metrics


@dataclass(frozen=True)
class Config:
    """The validated configuration and the plugin manager whose plugins contributed to its schema."""

    path: Path | None
    data: Mapping[str, Any] = field(repr=False)  # secrets in clear: see redacted()
    plugin_manager: pluggy.PluginManager = field(repr=False)
    plugin_origins: Mapping[str, str] = field(repr=False)
    transport_providers: Mapping[str, str] = field(repr=False)
    #: The absolute folder that relative paths in the config resolve against (see senddock.config.file.config_folder).
    folder: Path = field(default_factory=Path.cwd)
    #: The file's stamp when it was read (senddock.config.file.file_stamp): a running node re-reads
    #: its file only once that changes.
    file_stamp: tuple[int, int, int] | None = field(default=None, repr=False, compare=False)

    @property
    def transport(self) -> str:
        return transport_name(self.data["transport"])

    @property
    def max_consecutive_failures(self) -> int:
        setting = self.data["transport"]
        return setting.get("max_consecutive_failures", 20) if isinstance(setting, dict) else 20

    @property
    def poll_interval(self) -> float:
        return parse_duration(self.data["poll_interval"])

    @property
    def shutdown_timeout(self) -> float:
        return parse_duration(self.data["shutdown_timeout"])

    @property
    def concurrency(self) -> int:
        """Sends in flight per node: ``concurrency``, or its former name ``workers``."""
        data = self.data
        return data.get("concurrency") or data.get("workers") or DEFAULT_CONCURRENCY

    @property
    def claim_batch(self) -> int:
        return self.data["claim_batch"]

    @property
    def node_name(self) -> str | None:
        """The configured node name; None: the first free of HOST, HOST-2... (see core.node_names)."""
        return self.data["node"]["name"]

    @property
    def database(self) -> DatabaseSettings:
        db = self.data["database"]
        return DatabaseSettings(
            dsn=db["dsn"],
            direct_dsn=db["direct_dsn"],
            embedded_path=(self.folder / db["embedded"]["path"]).resolve(),
            pool_size=db["pool_size"],
            connect_timeout=parse_duration(db["connect_timeout"]),
            auto_migrate=db["auto_migrate"],
            result_commit=db["result_commit"],
            pool_mode=db["pool_mode"],
            stuck_after=parse_duration(db["stuck_after"]),
        )

    @property
    def retention(self) -> RetentionSettings:
        r = self.data["retention"]
        return RetentionSettings(broadcasts=_kept(r["broadcasts"]), inbound_mail=_kept(r["inbound_mail"]),
                                 campaign_events=_kept(r["campaign_events"]), every=parse_duration(r["every"]))

    @property
    def retry(self) -> RetrySettings:
        return retry_settings(self.data["retry"])

    @property
    def recovery(self) -> RecoverySettings:
        r = self.data["recovery"]
        return RecoverySettings(
            heartbeat=parse_duration(r["heartbeat"]),
            lease=parse_duration(r["lease"]),
            in_doubt=r["in_doubt"],
            max_rescues=r["max_rescues"],
            failover_window=parse_duration(r["failover_window"]),
        )

    @property
    def breaker(self) -> BreakerSettings:
        b = self.data["breaker"]
        return BreakerSettings(
            bounce_rate=float(b["bounce_rate"]),
            bounce_window=b["bounce_window"],
            early_bounces=b["early_bounces"],
            early_window=b["early_window"],
            probe_interval=parse_duration(b["probe_interval"]),
            probe_max_interval=parse_duration(b["probe_max_interval"]),
        )

    @property
    def pacing(self) -> PacingSettings:
        """The ``pacing`` section, typed (the section's types live with the limits they make:
        senddock.pacing.limits)."""
        return pacing_settings(self.data["pacing"])

    @property
    def logging(self) -> LoggingSettings:
        return LoggingSettings(**self.data["logging"])

    @property
    def metrics(self) -> MetricsSettings:
        return MetricsSettings(listen=self.data["metrics"]["listen"])

    @property
    def unsubscribe(self) -> UnsubscribeSettings:
        return unsubscribe_settings(self.data["unsubscribe"])

    @property
    def dkim(self) -> DkimSettings | None:
        """None without a ``dkim`` section: messages go out unsigned."""
        return dkim_settings(self.data["dkim"])

    @property
    def templates(self) -> TemplateSettings:
        return template_settings(self.data["templates"])

    @property
    def bounces(self) -> BouncesSettings:
        return bounces_settings(self.data["bounces"])

    @property
    def serve(self) -> ServeSettings:
        return serve_settings(self.data["serve"])

    def section(self, name: str) -> Mapping[str, Any]:
        """A plugin's own section, as validated (senddock's own sections have typed properties)."""
        return self.data.get(name) or {}

    def redacted(self) -> dict[str, Any]:
        """The effective configuration with every secret masked, safe to print or log."""
        return redact(copy.deepcopy(dict(self.data)))


def find_config_path(explicit: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> Path | None:
    """``-c FILE``, else ``$SENDDOCK_CONFIG``, else ``config/senddock.yaml`` or ``senddock.yaml`` if present."""
    if explicit:
        return Path(explicit)
    if environ.get(ENV_CONFIG):
        return Path(environ[ENV_CONFIG])
    return next((p for p in DEFAULT_CONFIG_PATHS if p.is_file()), None)


def transport_name(setting: str | Mapping[str, Any]) -> str:
    """``transport: smtp`` and ``transport: {name: smtp, ...}`` name the same transport."""
    return setting if isinstance(setting, str) else setting["name"]

