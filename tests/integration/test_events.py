"""Provider notifications: SES bounces and complaints (bare or in their SNS envelope) through
`senddock events ingest`, after a real broadcast through the ses_like transport and moto."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_ses_like import aws_env, moto_server  # noqa: F401 - fixtures
from tests_support import make_broadcast, suppressed

from senddock.api import Senddock
from senddock.testing import drain, fast_settings

EMAILS = [f"user{i}@example.com" for i in range(5)]


def sns(message: dict) -> dict:
    """The SNS envelope SES notifications arrive in: Message is a JSON string."""
    return {"Type": "Notification", "MessageId": "sns-1", "TopicArn": "arn:aws:sns:us-east-1:123:ses",
            "Message": json.dumps(message), "Timestamp": "2026-12-02T10:00:00.000Z", "SignatureVersion": "1"}


def bounce(message_id, email, bounce_type="Permanent", sub_type="General", feedback="fb-1", tags=None):
    return {"notificationType": "Bounce",
            "bounce": {"bounceType": bounce_type, "bounceSubType": sub_type, "feedbackId": feedback,
                       "timestamp": "2026-12-02T10:00:00.000Z",
                       "bouncedRecipients": [{"emailAddress": email, "action": "failed", "status": "5.1.1",
                                              "diagnosticCode": "smtp; 550 5.1.1 user unknown"}]},
            "mail": {"messageId": message_id, "timestamp": "2026-12-02T09:59:00.000Z", "source": "news@example.com",
                     "destination": [email], **({"tags": tags} if tags else {})}}


def complaint(message_id, email):
    return {"notificationType": "Complaint",
            "complaint": {"complainedRecipients": [{"emailAddress": email}], "feedbackId": "fb-c",
                          "complaintFeedbackType": "abuse", "timestamp": "2026-12-02T10:05:00.000Z"},
            "mail": {"messageId": message_id, "destination": [email]}}


def delivery(message_id, email):
    return {"notificationType": "Delivery",
            "delivery": {"recipients": [email], "smtpResponse": "250 2.0.0 OK", "timestamp": "2026-12-02T10:01:00Z"},
            "mail": {"messageId": message_id, "destination": [email]}}


@pytest.fixture
def sent(make_config, moto_server, tmp_path):  # noqa: F811 - the imported fixture
    """Five messages sent through ses_like: (app, config path, {email: provider message id})."""
    settings = fast_settings(transport="ses_like", ses_like={"endpoint_url": moto_server})
    app = Senddock(make_config(settings))
    make_broadcast(app, EMAILS)
    drain(app.config)
    with app.db.connection() as conn:
        ids = dict(conn.execute("SELECT email, provider_message_id FROM broadcast_jobs").fetchall())
    assert len(ids) == 5 and all(ids.values())
    yield app, app.config.path, ids
    app.close()


def test_notifications_suppress_exactly_permanent_bounces_and_complaints(cli, sent, tmp_path):
    app, config, ids = sent
    lines = [
        sns(bounce(ids["user0@example.com"], "user0@example.com")),
        bounce(ids["user1@example.com"], "user1@example.com", sub_type="OnAccountSuppressionList", feedback="fb-2"),
        sns(bounce(ids["user2@example.com"], "user2@example.com", bounce_type="Transient", sub_type="MailboxFull",
                   feedback="fb-3")),
        sns(complaint(ids["user3@example.com"], "user3@example.com")),
        sns(delivery(ids["user4@example.com"], "user4@example.com")),
        sns(bounce("0100-no-such-message", "someone@example.com", feedback="fb-4")),
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(doc) for doc in lines) + "\n{not json\n", encoding="utf-8")

    first = cli("events", "ingest", path, "-c", config, "--json")
    assert first.exit_code == 1
    assert first.json["recorded"] == 5 and first.json["suppressed"] == 3
    assert first.json["problems"] == [
        f"{path}:6: no job sent message id 0100-no-such-message to someone@example.com",
        f"{path}:7: not JSON: Expecting property name enclosed in double quotes",
    ]
    assert suppressed(app) == {"user0@example.com": "bounced", "user1@example.com": "bounced",
                               "user3@example.com": "complained"}
    with app.db.connection() as conn:
        codes = dict(conn.execute("SELECT lower(email), code FROM suppressions").fetchall())
        log = conn.execute("SELECT email, kind, bounce_type, sub_type, suppresses FROM delivery_events "
                           "ORDER BY email").fetchall()
    assert codes["user1@example.com"] == "OnAccountSuppressionList"  # mirrored from the provider's list
    assert log == [("user0@example.com", "bounce", "Permanent", "General", True),
                   ("user1@example.com", "bounce", "Permanent", "OnAccountSuppressionList", True),
                   ("user2@example.com", "bounce", "Transient", "MailboxFull", False),
                   ("user3@example.com", "complaint", None, "abuse", True),
                   ("user4@example.com", "delivery", None, None, False)]

    again = cli("events", "ingest", path, "-c", config, "--json")
    assert (again.json["recorded"], again.json["already_recorded"], again.json["suppressed"]) == (0, 5, 0)
    with app.db.connection() as conn:
        assert conn.execute("SELECT count(*) FROM delivery_events").fetchone() == (5,)
        assert conn.execute("SELECT count(*) FROM suppressions").fetchone() == (3,)

    # The next campaign to the list skips the suppressed addresses.
    next_campaign = app.create_campaign(name="next", lists=["news"], subject="Again", from_addr="news@example.com",
                                        text_body="Hi again")
    result = app.send_campaign(next_campaign)
    assert (result.enqueued, result.skipped_suppressed) == (2, 3)


def test_a_job_is_found_by_its_tag_when_its_message_id_was_never_committed(cli, sent, tmp_path):
    app, config, ids = sent
    with app.db.connection() as conn:
        job_id = conn.execute("UPDATE broadcast_jobs SET provider_message_id = NULL WHERE email = 'user0@example.com' "
                              "RETURNING id").fetchone()[0]
    doc = bounce("0100-late", "user0@example.com", tags={"senddock-job": [str(job_id)]})
    path = tmp_path / "events.json"
    path.write_text(json.dumps([doc]), encoding="utf-8")  # the JSON array form
    result = cli("events", "ingest", path, "-c", config, "--json")
    assert result.exit_code == 0, result.stderr
    assert suppressed(app) == {"user0@example.com": "bounced"}
    with app.db.connection() as conn:
        assert conn.execute("SELECT provider_message_id FROM broadcast_jobs WHERE id = %s", (job_id,)).fetchone() == (
            "0100-late",)


def test_a_notification_about_another_address_than_the_jobs_is_refused(cli, sent, tmp_path):
    app, config, ids = sent
    path = tmp_path / "forged.jsonl"
    path.write_text(json.dumps(sns(bounce(ids["user0@example.com"], "ceo@example.com"))) + "\n", encoding="utf-8")
    result = cli("events", "ingest", path, "-c", config)
    assert result.exit_code == 1
    assert suppressed(app) == {}


def test_an_ses_notification_that_cannot_be_read_is_a_line_not_a_traceback(cli, sent, tmp_path):
    app, config, _ = sent
    path = tmp_path / "broken.jsonl"
    envelope = {"Type": "Notification", "TopicArn": "arn:aws:sns:us-east-1:1:ses", "Message": "{not json"}
    path.write_text(json.dumps(envelope) + "\n", encoding="utf-8")
    result = cli("events", "ingest", path, "-c", config)
    assert result.exit_code == 1
    assert f"{path}:1: SNS notification whose Message is not a JSON document" in result.stderr
    assert "Traceback" not in result.stderr


# -- the SNS webhook of `senddock serve` ---------------------------------------------------------

CERT_URL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-test.pem"


def signing_key(folder: Path, name: str):
    """A key and a self-signed certificate standing in for SNS's."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.amazonaws.com")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    path = folder / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, path


def signed(envelope: dict, key, cert_url: str = CERT_URL) -> dict:
    import base64

    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    from senddock.web.sns import string_to_sign

    envelope = {**envelope, "SignatureVersion": "2", "SigningCertURL": cert_url}
    signature = key.sign(string_to_sign(envelope), padding.PKCS1v15(), hashes.SHA256())
    return {**envelope, "Signature": base64.b64encode(signature).decode()}


@pytest.fixture
def webhook(sent, tmp_path):
    """A running `senddock serve` trusting a test certificate for CERT_URL: (post, app, ids, sns key)."""
    import os
    import subprocess
    import urllib.error
    import urllib.request

    import yaml

    from senddock.sink import free_port
    from tests_support import senddock_executable, wait_for

    app, config_path, ids = sent
    key, cert = signing_key(tmp_path, "sns")
    port = free_port("127.0.0.1")
    settings = yaml.safe_load(Path(config_path).read_text())
    settings["serve"] = {"port": port, "sns_certificates": {CERT_URL: str(cert)},
                         "sns_topic_arns": ["arn:aws:sns:us-east-1:123:ses"]}
    Path(config_path).write_text(yaml.safe_dump(settings))
    server = subprocess.Popen([senddock_executable(), "serve", "-c", str(config_path)], env=dict(os.environ),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def post(body) -> int:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/webhooks/ses", data=data, method="POST",
                                         headers={"Content-Type": "text/plain; charset=UTF-8"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    try:
        wait_for(healthy, 20, "senddock serve")
        yield post, app, ids, key
    finally:
        server.terminate()
        assert server.wait(20) == 0, server.stderr.read().decode()[-2000:]


def test_signed_sns_deliveries_apply_and_forgeries_are_refused(webhook, tmp_path):
    post, app, ids, key = webhook
    other_key, _ = signing_key(tmp_path, "attacker")
    note = sns(bounce(ids["user0@example.com"], "user0@example.com"))

    assert post(note) == 403  # unsigned
    assert post(signed(note, other_key)) == 403  # signed by someone else
    assert post(signed(note, key, "https://evil.example.com/cert.pem")) == 403  # certificate from anywhere
    tampered = signed(note, key)
    tampered["Message"] = json.dumps(bounce(ids["user1@example.com"], "user1@example.com"))
    assert post(tampered) == 403
    assert suppressed(app) == {}

    other_topic = signed({**note, "TopicArn": "arn:aws:sns:us-east-1:666:attacker"}, key)
    assert post(other_topic) == 403  # validly signed by SNS, but not a topic of ours
    assert post(b"{not json") == 400
    assert post(signed(sns(bounce("0100-not-yet", "user2@example.com", feedback="fb-9")), key)) == 503  # SNS retries
    confirm = {"Type": "SubscriptionConfirmation", "MessageId": "m", "Token": "t",
               "TopicArn": "arn:aws:sns:us-east-1:123:ses",
               "Message": "confirm", "SubscribeURL": "https://evil.example.com/confirm", "Timestamp": "2026-12-02T10:00:00Z"}
    assert post(signed(confirm, key)) == 400  # never follows a SubscribeURL off SNS

    assert post(signed(note, key)) == 200
    assert post(signed(sns(complaint(ids["user3@example.com"], "user3@example.com")), key)) == 200
    assert post(signed(note, key)) == 200  # SNS delivers at least once: the repeat changes nothing
    assert suppressed(app) == {"user0@example.com": "bounced", "user3@example.com": "complained"}
    with app.db.connection() as conn:
        assert conn.execute("SELECT count(*) FROM delivery_events").fetchone() == (2,)


def test_an_internationalised_domain_matches_in_its_idna_form(cli, make_config, moto_server, tmp_path):  # noqa: F811
    """Transports send bücher.example as xn--bcher-kva.example; that is what SES reports back."""
    app = Senddock(make_config(fast_settings(transport="ses_like", ses_like={"endpoint_url": moto_server})))
    import boto3

    boto3.client("sesv2", region_name="us-east-1", endpoint_url=moto_server).create_email_identity(
        EmailIdentity="xn--bcher-kva.example")
    make_broadcast(app, ["leser@bücher.example"])
    drain(app.config)
    with app.db.connection() as conn:
        message_id = conn.execute("SELECT provider_message_id FROM broadcast_jobs").fetchone()[0]
    path = tmp_path / "idn.jsonl"
    path.write_text(json.dumps(sns(bounce(message_id, "leser@xn--bcher-kva.example"))) + "\n", encoding="utf-8")
    result = cli("events", "ingest", path, "-c", app.config.path)
    assert result.exit_code == 0, result.stderr
    assert suppressed(app) == {"leser@bücher.example": "bounced"}
    app.close()
