"""Which limits a send is subject to: the ``pacing`` section, typed, and a job's limit keys.

Every limit has a key, shared by all nodes through the limiter's table (``pacing_limits``):
``global``, ``transport:NAME``, ``domain:GROUP`` (a group is named by its first ``match`` entry) and
``campaign:ID``. A send is admitted only when every one of its limits admits it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from senddock.durations import parse_duration
from senddock.pacing.adaptive import Adaptive, adaptive_problems, adaptive_settings
from senddock.pacing.rates import Rate, parse_rate, rate_problem


@dataclass(frozen=True)
class Limit:
    key: str
    rate: Rate


@dataclass(frozen=True)
class DomainGroup:
    """Recipient domains paced together, e.g. gmail.com and googlemail.com (one provider)."""

    match: tuple[str, ...]  # lower case; `*.example.com` matches every subdomain, not example.com
    rate: Rate | None
    concurrency: int | None  # sends in flight to the group, all nodes together

    @property
    def name(self) -> str:
        return self.match[0]

    def matches(self, domain: str) -> bool:
        return any(_matches(pattern, domain) for pattern in self.match)


@dataclass(frozen=True)
class PacingSettings:
    global_rate: Rate | None = None
    transports: Mapping[str, Rate] = field(default_factory=dict)
    domains: tuple[DomainGroup, ...] = ()
    adaptive: Adaptive | None = None  # None: throttling replies leave the rates alone
    # How late a send may reach the relay: what every limit's burst keeps back for it (see Pacer).
    latency_margin: float = 0.25  # the config's default

    def group_for(self, domain: str) -> DomainGroup | None:
        """The first group matching the recipient domain ``domain``: groups are matched in order."""
        domain = normalize_domain(domain)
        return next((g for g in self.domains if g.matches(domain)), None)


def limits_for(
    pacing: PacingSettings,
    *,
    transport: str,
    domain: str,
    campaign_id: int | None = None,
    campaign_rate: Rate | None = None,
) -> tuple[Limit, ...]:
    """The limits one send is subject to, most general first: nothing limits what is not configured."""
    limits = []
    if pacing.global_rate is not None:
        limits.append(Limit("global", pacing.global_rate))
    if transport in pacing.transports:
        limits.append(Limit(f"transport:{transport}", pacing.transports[transport]))
    group = pacing.group_for(domain)
    if group is not None and group.rate is not None:
        limits.append(Limit(f"domain:{group.name}", group.rate))
    if campaign_id is not None and campaign_rate is not None:
        limits.append(Limit(f"campaign:{campaign_id}", campaign_rate))
    return tuple(limits)


def throttled_limit(limits: Sequence[Limit]) -> Limit | None:
    """The limit a throttling reply to a send under ``limits`` slows down: the recipient's domain
    group when it has a rate (one slow provider must not slow the others), else the transport's,
    else the global one. Never a campaign's own rate: a provider throttles senders, not campaigns."""
    by_kind = {limit.key.partition(":")[0]: limit for limit in limits}
    return by_kind.get("domain") or by_kind.get("transport") or by_kind.get("global")


def recipient_domain(email: str) -> str:
    """The domain of an address, as groups are matched against it."""
    return normalize_domain(email.rpartition("@")[2])


def normalize_domain(domain: str) -> str:
    """Lower case, no trailing dot, and an internationalized name in its ASCII (IDNA) form: the
    config can only name domains in ASCII, and `Gmail.com.` is gmail.com."""
    domain = domain.strip().rstrip(".").lower()
    if not domain.isascii():
        try:
            domain = domain.encode("idna").decode("ascii")
        except UnicodeError:
            pass  # not a valid name: it matches no group, which is all that matters here
    return domain


def pacing_settings(section: Mapping[str, Any]) -> PacingSettings:
    """The validated ``pacing`` section (defaults filled), typed."""
    return PacingSettings(
        global_rate=None if section["global"] is None else _rate(section["global"]),
        transports={name: _rate(value) for name, value in section["transports"].items()},
        domains=tuple(
            DomainGroup(
                match=tuple(normalize_domain(m) for m in group["match"]),
                rate=parse_rate(group["rate"], group.get("burst")) if "rate" in group else None,
                concurrency=group.get("concurrency"),
            )
            for group in section["domains"]
        ),
        adaptive=adaptive_settings(section["adaptive"]),
        latency_margin=parse_duration(section["latency_margin"]),
    )


def pacing_problems(section: Mapping[str, Any], transports: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """(json path, message) for what the schema cannot say: a rate of 0, a burst without its rate,
    a limit for a transport that is not installed, a domain an earlier group already takes."""
    for path, value in _rates(section):
        problem = rate_problem(value)
        if problem:
            yield path, problem
    for name in section["transports"]:
        if name not in transports:
            installed = ", ".join(sorted(transports)) or "none"
            yield f"$.pacing.transports.{name}", f"{name!r} is not an installed transport (installed: {installed})"
    seen: list[tuple[str, int]] = []
    for i, group in enumerate(section["domains"]):
        if "burst" in group and "rate" not in group:
            yield f"$.pacing.domains[{i}].burst", "a burst needs a rate beside it"
        for j, entry in enumerate(group["match"]):
            entry = normalize_domain(entry)
            earlier = next(((pattern, g) for pattern, g in seen if _covers(pattern, entry)), None)
            if earlier is not None:
                pattern, g = earlier
                where = "this group" if g == i else f"$.pacing.domains[{g}]"
                by = "" if pattern == entry else f" (by {pattern!r})"
                yield (f"$.pacing.domains[{i}].match[{j}]", f"{entry!r} is already matched by {where}{by}: "
                       "a domain is paced by the first group that matches it")
            seen.append((entry, i))
    yield from adaptive_problems(section["adaptive"])


def _rate(value: str | Mapping[str, Any]) -> Rate:
    """``20/s`` or ``{rate: 20/s, burst: 40}``."""
    if isinstance(value, str):
        return parse_rate(value)
    return parse_rate(value["rate"], value.get("burst"))


def _rates(section: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    def one(path: str, value: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(value, str):
            yield path, value
        elif isinstance(value, Mapping):
            yield f"{path}.rate", value["rate"]

    yield from one("$.pacing.global", section["global"])
    for name, value in section["transports"].items():
        yield from one(f"$.pacing.transports.{name}", value)
    for i, group in enumerate(section["domains"]):
        if "rate" in group:
            yield f"$.pacing.domains[{i}].rate", group["rate"]


def _matches(pattern: str, domain: str) -> bool:
    if pattern.startswith("*."):
        return domain.endswith(pattern[1:])  # ".example.com": at least one label in front
    return domain == pattern


def _covers(earlier: str, entry: str) -> bool:
    """Whether every domain ``entry`` matches is already matched by ``earlier``."""
    if entry.startswith("*."):
        return earlier == entry or (earlier.startswith("*.") and entry[1:].endswith(earlier[1:]))
    return _matches(earlier, entry)
