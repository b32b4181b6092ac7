"""senddock's own sections, typed: durations in seconds, sizes in bytes, paths as written, and
secrets that no repr prints (a section logged by mistake shows no key)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path

from argon2 import PasswordHasher

from senddock.config import (AdminSettings, BounceMailboxSettings, BounceReceiveSettings, BouncesSettings,
                             DkimSettings, MetricsSettings, ServeMetricsSettings, ServeSettings, SoftBounceSettings,
                             TemplateSettings, UnsubscribeSettings)
from senddock.config import bounces as config_bounces
from senddock.config import mail as config_mail
from senddock.config import sections as config_sections
from senddock.config import serve as config_serve
from senddock.loading import load_config
from senddock.redact import is_secret_key

# Every secret of senddock's own sections, each from the environment as the file must take it.
SECRETS = {
    "UNSUBSCRIBE_SECRET": "unsubscribe-secret-0123456789",
    "BOUNCES_NEW": "bounces-new-key-0123456789",
    "BOUNCES_OLD": "bounces-old-key-0123456789",
    "MAILBOX_PASSWORD": "mailbox-password-0123456789",
    "DKIM_KEY": "-----BEGIN PRIVATE KEY-----\ndkim-key-0123456789\n-----END PRIVATE KEY-----\n",
    "ADMIN_HASH": PasswordHasher().hash("the admin's password"),
    "SESSION_SECRET": "session-secret-0123456789-0123456789",
    "METRICS_TOKEN": "metrics-token-0123456789",
}

WRITTEN = """\
metrics: {listen: "127.0.0.1:9464"}
unsubscribe: {url: "https://news.example.com", mailto: "unsubscribe@example.com", secret: "${UNSUBSCRIBE_SECRET}"}
dkim: {domain: example.com, selector: s2024, private_key: "${DKIM_KEY}"}
templates: {max_size: 1MiB, max_render_time: 500ms}
bounces:
  secret: ["${BOUNCES_NEW}", "${BOUNCES_OLD}"]
  soft: {limit: 5, window: 7d}
  max_message_size: 2MiB
  receive: {listen: "[::1]:2600", addresses: ["bounces+*@example.com"], session_lifetime: 1m, in_serve: true}
  mailbox: {url: "imap://bounces@imap.example.com/INBOX", password: "${MAILBOX_PASSWORD}", ca_file: ca.pem,
            after: "move:Done", interval: 2m}
serve:
  port: 8443
  tls_cert_file: certs/serve.pem
  tls_key_file: certs/serve.key
  max_body: 1MiB
  trusted_proxies: [10.0.0.0/8]
  sns_certificates: {"https://sns.us-east-1.amazonaws.com/cert.pem": sns.pem}
  sns_topic_arns: ["arn:aws:sns:us-east-1:123456789012:ses-events"]
  metrics: {allow: [10.1.0.0/16], token: "${METRICS_TOKEN}", min_interval: 0s}
  admin: {username: admin, password_hash: "${ADMIN_HASH}", session_secret: "${SESSION_SECRET}", session_lifetime: 1h}
"""


def written(tmp_path: Path):
    path = tmp_path / "senddock.yaml"
    path.write_text(WRITTEN, encoding="utf-8")
    return load_config(path, environ=SECRETS)


def test_the_defaults_typed():
    config = load_config(None, environ={})
    assert config.metrics == MetricsSettings(listen=None)
    assert config.unsubscribe == UnsubscribeSettings(url=None, mailto=None, secret=None)
    assert not config.unsubscribe.configured
    assert config.dkim is None
    assert config.templates == TemplateSettings(max_size=5 * 1024 * 1024, max_render_time=2.0)
    assert config.bounces == BouncesSettings(
        secrets=(), soft=SoftBounceSettings(limit=3, window=30 * 86400.0), max_message_size=10 * 1024 * 1024,
        receive=BounceReceiveSettings(listen="127.0.0.1:2526", addresses=None, max_connections=20,
                                      max_sessions_per_client=3, session_lifetime=600.0, max_recipients=100,
                                      in_serve=False),
        mailbox=BounceMailboxSettings(url=None, password=None, security="tls", verify=True, ca_file=None,
                                      after="delete", unreadable="senddock-unreadable", interval=60.0, timeout=30.0))
    assert config.serve == ServeSettings(
        host="127.0.0.1", port=8025, tls_cert_file=None, tls_key_file=None, max_body=256 * 1024, body_timeout=10.0,
        header_timeout=10.0, max_connections=100, max_connections_per_client=20, trusted_proxies=(),
        keep_alive_timeout=5.0, sns_certificate_timeout=5.0, sns_certificates={}, sns_topic_arns=(),
        metrics=ServeMetricsSettings(allow=("127.0.0.1/32", "::1/128"), token=None, min_interval=5.0), admin=None)


def test_written_values_typed_with_paths_as_written(tmp_path: Path):
    config = written(tmp_path)
    assert config.metrics.listen == "127.0.0.1:9464"
    assert config.unsubscribe == UnsubscribeSettings("https://news.example.com", "unsubscribe@example.com",
                                                     SECRETS["UNSUBSCRIBE_SECRET"])
    assert config.unsubscribe.configured
    assert config.dkim == DkimSettings("example.com", "s2024", private_key=SECRETS["DKIM_KEY"])
    assert config.templates == TemplateSettings(max_size=1024 * 1024, max_render_time=0.5)
    bounces = config.bounces
    assert bounces.secrets == (SECRETS["BOUNCES_NEW"], SECRETS["BOUNCES_OLD"])  # the first signs
    assert (bounces.soft, bounces.max_message_size) == (SoftBounceSettings(5, 7 * 86400.0), 2 * 1024 * 1024)
    assert (bounces.receive.listen, bounces.receive.addresses, bounces.receive.session_lifetime,
            bounces.receive.in_serve) == ("[::1]:2600", ("bounces+*@example.com",), 60.0, True)
    assert (bounces.mailbox.password, bounces.mailbox.ca_file, bounces.mailbox.after, bounces.mailbox.interval) == (
        SECRETS["MAILBOX_PASSWORD"], "ca.pem", "move:Done", 120.0)
    serve = config.serve
    assert (serve.port, serve.tls_cert_file, serve.tls_key_file, serve.max_body, serve.trusted_proxies) == (
        8443, "certs/serve.pem", "certs/serve.key", 1024 * 1024, ("10.0.0.0/8",))
    assert serve.sns_certificates == {"https://sns.us-east-1.amazonaws.com/cert.pem": "sns.pem"}
    assert serve.sns_topic_arns == ("arn:aws:sns:us-east-1:123456789012:ses-events",)
    assert serve.metrics == ServeMetricsSettings(("10.1.0.0/16",), SECRETS["METRICS_TOKEN"], 0.0)
    assert serve.admin == AdminSettings("admin", SECRETS["ADMIN_HASH"], 3600.0, SECRETS["SESSION_SECRET"], 2)


def test_one_bounces_secret_written_alone_is_a_tuple_of_one(tmp_path: Path):
    path = tmp_path / "senddock.yaml"
    path.write_text('bounces: {secret: "${KEY}"}\n', encoding="utf-8")
    assert load_config(path, environ={"KEY": SECRETS["BOUNCES_NEW"]}).bounces.secrets == (SECRETS["BOUNCES_NEW"],)


def test_no_typed_section_prints_a_secret(tmp_path: Path):
    config = written(tmp_path)
    # The whole Config too: its raw data holds every secret in clear (config.redacted() masks them).
    sections = [config, config.metrics, config.unsubscribe, config.dkim, config.templates, config.bounces, config.serve]
    shown = "\n".join(map(repr, sections)) + "\n" + "\n".join(map(str, sections))
    leaked = [name for name, value in SECRETS.items() if value in shown]
    assert leaked == []
    # What is not secret is still shown: the repr is for reading, not blanked.
    assert "imap://bounces@imap.example.com/INBOX" in shown and "s2024" in shown and "'admin'" in shown


def test_every_secret_field_of_a_typed_section_is_left_out_of_its_repr():
    """A secret added to a section later must be marked too: by the rule redact() masks keys by."""
    classes = [obj for module in (config_bounces, config_mail, config_serve, config_sections)
               for obj in vars(module).values() if is_dataclass(obj) and obj.__module__ == module.__name__]
    assert {c.__name__ for c in classes} >= {"BouncesSettings", "ServeSettings", "AdminSettings", "DkimSettings"}
    # removesuffix: `secrets` holds several of them.
    shown = [f"{c.__name__}.{f.name}" for c in classes for f in fields(c)
             if f.repr and is_secret_key(f.name.removesuffix("s"))]
    assert shown == []
