"""The ses_like transport end to end: a broadcast through moto's SES server (sesv2, Raw content),
and the error table against a local peer answering in the SES JSON error format."""

from __future__ import annotations

import json
import threading
import urllib.request
from email import message_from_bytes
from email.policy import default as default_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import dkim
import pytest

from senddock.api import Senddock
from senddock.mail import mime
from senddock.outcome import CampaignContent, Recipient
from senddock.testing import drain, fast_settings
from senddock_ses_like import transport
from senddock_ses_like.classify import classify
from tests_support import dkim_key, dns_for, jobs_by_email, make_broadcast, suppressed

FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing-secret",
                    "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture
def aws_env(monkeypatch):
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def moto_server(aws_env):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    # moto's state lives in this process, shared by every server it starts: begin from nothing.
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10).close()
    # moto refuses a send from an identity nobody created, as SES does.
    boto3.client("sesv2", region_name="us-east-1", endpoint_url=url).create_email_identity(EmailIdentity="example.com")
    yield url
    server.stop()


def raw_messages(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/moto-api/data.json", timeout=10) as response:
        data = json.load(response)
    return data["ses"]["RawMessage"]


def test_a_broadcast_through_ses_like_sends_the_same_message_as_smtp(make_config, moto_server, tmp_path):
    key_file, record = dkim_key(tmp_path)
    app = Senddock(make_config(fast_settings(
        transport="ses_like", ses_like={"endpoint_url": moto_server, "timeout": "5s"},
        dkim={"domain": "example.com", "selector": "s1", "private_key_file": str(key_file)})))
    emails = [f"user{i}@example.com" for i in range(12)]
    campaign_id = make_broadcast(app, emails)
    drain(app.config)
    assert app.campaign_status(campaign_id).sent == 12

    sent = raw_messages(moto_server)
    assert len(sent) == 12
    with app.db.connection() as conn:
        jobs = {row[0]: row[1:] for row in conn.execute(
            "SELECT j.email, j.id, j.broadcast_id, j.provider_message_id, a.provider_message_id "
            "FROM broadcast_jobs j JOIN delivery_attempts a ON a.job_id = j.id")}
    content = CampaignContent(**_content(app, campaign_id))
    for item in sent:
        parsed = message_from_bytes(item["raw_data"].encode(), policy=default_policy)
        email = parsed["To"].addresses[0].addr_spec
        job_id, broadcast_id, job_message_id, attempt_message_id = jobs[email]
        # The provider's id is stored on the job and on its attempt.
        assert job_message_id == attempt_message_id == item["id"]
        # The very message the SMTP transport would build for this job: same headers, same Message-ID.
        composer = app.composer
        expected = composer.message(composer.prepare(content), Recipient(email, "", {}, _subscriber_id(app, email)),
                                    job_id=job_id, broadcast_id=broadcast_id, attempt=1)
        expected_parsed = message_from_bytes(mime.message_bytes(expected), policy=default_policy)
        unstable = {"Date", "DKIM-Signature"}
        assert [(k, str(v)) for k, v in parsed.items() if k not in unstable] == \
               [(k, str(v)) for k, v in expected_parsed.items() if k not in unstable]
        assert parsed["Message-ID"] == f"<senddock.{broadcast_id}.{job_id}@example.com>"
        assert dkim.verify(item["raw_data"].encode(), dnsfunc=dns_for(record))
        # SES rewrites Message-ID and Date: they are left out of the signature it would break.
        signed = {h.strip().lower() for h in parsed["DKIM-Signature"].split("h=")[1].split(";")[0].split(":")}
        assert "list-unsubscribe" in signed and not signed & {"message-id", "date"}
    app.close()


class _SesErrorPeer(BaseHTTPRequestHandler):
    """Answers every SendEmail with the error the test chose, in the SES v2 JSON error format."""

    answer: tuple[int, str, str] = (500, "InternalFailure", "boom")

    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, code, message = self.answer
        body = json.dumps({"message": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("x-amzn-ErrorType", f"{code}:http://internal.amazon.com/coral/com.amazonaws.sesv2/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def error_peer(aws_env):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SesErrorPeer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


@pytest.mark.parametrize(
    ("status", "code", "message", "outcome", "reason"),
    [
        (429, "TooManyRequestsException", "Too Many Requests", "retry", "throttled"),
        (400, "Throttling", "Maximum sending rate exceeded.", "retry", "throttled"),
        (400, "Throttling", "Daily message quota exceeded.", "pause", "daily_quota_exceeded"),
        (400, "AccountSuspendedException", "account suspended", "pause", "account_suspended"),
        (400, "SendingPausedException", "sending paused", "pause", "sending_paused"),
        (400, "MailFromDomainNotVerifiedException", "not verified", "pause", "mail_from_not_verified"),
        (400, "MessageRejected", "Email address is not verified.", "fail", "message_rejected"),
        (400, "LimitExceededException", "limit", "fail", "limit_exceeded"),
        (404, "NotFoundException", "Configuration set news does not exist.", "fail", "not_found"),
        (400, "BadRequestException", "bad request", "fail", "bad_request"),
        (500, "InternalFailure", "internal failure", "retry", "provider_error"),
        (503, "ServiceUnavailable", "unavailable", "retry", "provider_error"),
    ],
)
def test_each_error_row_through_the_real_client(error_peer, status, code, message, outcome, reason):
    _SesErrorPeer.answer = (status, code, message)
    message_obj = _message()
    settings = {"region": "us-east-1", "endpoint_url": f"http://127.0.0.1:{error_peer.server_port}", "timeout": "5s"}
    ses = transport.client(settings)
    result = transport.send(message_obj, settings, ses)
    ses.close()
    assert (result.ok, result.code) == (False, status)
    assert result.text == f"{code}: {message}"
    verdict = classify(result)
    assert (verdict.outcome.value, verdict.reason) == (outcome, reason)


def test_a_suspended_account_pauses_the_campaign_and_fails_nobody(make_config, error_peer):
    _SesErrorPeer.answer = (400, "AccountSuspendedException", "Your account is suspended")
    app = Senddock(make_config(fast_settings(
        transport="ses_like", ses_like={"endpoint_url": f"http://127.0.0.1:{error_peer.server_port}"})))
    campaign_id = make_broadcast(app, [f"user{i}@example.com" for i in range(6)])
    drain(app.config)
    status = app.campaign_status(campaign_id)
    assert (status.status, status.paused_reason, status.pending, status.failed) == ("paused", "account_suspended", 6, 0)
    assert suppressed(app) == {}
    assert set(jobs_by_email(app, campaign_id).values()) == {("pending", None, 0)}
    app.close()


def test_a_peer_that_never_answers_is_in_doubt_after_the_timeout(aws_env):
    """SendEmail has no idempotency token: once the request is out, a timeout may hide a send."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    settings = {"region": "us-east-1", "endpoint_url": f"http://127.0.0.1:{listener.getsockname()[1]}",
                "timeout": "1s"}
    result = transport.send(_message(), settings, transport.client(settings))
    listener.close()
    verdict = classify(result)
    assert (verdict.outcome.value, verdict.in_doubt) == ("retry", True)


def _message():
    from senddock.loading import load_config
    from senddock.mail.compose import Composer

    composer = Composer(load_config(None, environ={"SENDDOCK_DATABASE_URL": "postgresql://x@localhost/x"}))
    content = CampaignContent(campaign_id=1, name="c", subject="Hi", from_addr="news@example.com", text_body="Hello")
    return composer.message(composer.prepare(content), Recipient("ada@example.com", "Ada", {}, 1),
                            job_id=1, broadcast_id=1, attempt=1)


def _content(app, campaign_id):
    from senddock.domain import campaigns

    with app.db.connection() as conn:
        return campaigns.campaign_content(conn, campaign_id)


def _subscriber_id(app, email):
    with app.db.connection() as conn:
        return conn.execute("SELECT id FROM subscribers WHERE email = %s", (email,)).fetchone()[0]
