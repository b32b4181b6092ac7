"""`senddock bounces fetch`: the bounce mailbox, read over IMAP (imap-tools) or POP3 (poplib).

Each message is applied first, and only then deleted or moved (``bounces.mailbox.after``): a
crash in between leaves it in the mailbox, and reading it again is a replay, recorded once. A
message whose application failed (the database, an on_bounced hook) stays where it is for the
next fetch.
"""

from __future__ import annotations

import poplib
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from senddock.config import Config
from senddock.errors import UsageError

DEFAULT_PORTS = {("imap", "tls"): 993, ("imap", "starttls"): 143, ("imap", "none"): 143,
                 ("pop3", "tls"): 995, ("pop3", "starttls"): 110, ("pop3", "none"): 110}


@dataclass(frozen=True)
class MailboxSettings:
    protocol: str  # imap | pop3
    host: str
    port: int
    user: str
    password: str
    folder: str  # IMAP only
    security: str  # tls | starttls | none
    verify: bool
    ca_file: str | None
    after: str  # delete | move:FOLDER
    interval: float
    timeout: float
    unreadable: str = "senddock-unreadable"  # IMAP: where a message that cannot be applied is moved

    @property
    def label(self) -> str:
        where = f"/{self.folder}" if self.protocol == "imap" else ""
        return f"{self.protocol}://{self.user}@{self.host}:{self.port}{where}"


def mailbox_settings(config: Config) -> MailboxSettings:
    """``bounces.mailbox``, typed; UsageError naming the key when it cannot be used."""
    section = config.bounces.mailbox
    if not section.url:
        raise UsageError("bounces.mailbox.url: set the mailbox bounces are delivered to "
                         "(e.g. imap://bounces@imap.example.com/INBOX)")
    url = urlsplit(section.url)
    protocol = url.scheme.lower()
    security = section.security
    after = section.after
    if protocol == "pop3" and after != "delete":
        raise UsageError(f"bounces.mailbox.after: POP3 has no folders: only delete, not {after!r}")
    if not url.hostname or not url.username:
        raise UsageError("bounces.mailbox.url: needs a user and a host (imap://USER@HOST/FOLDER)")
    if url.password:
        raise UsageError("bounces.mailbox.url: no password in the URL: set bounces.mailbox.password "
                         "from the environment")
    if not section.password:
        raise UsageError("bounces.mailbox.password: required (${SENDDOCK_BOUNCES_MAILBOX_PASSWORD})")
    try:
        port = url.port or DEFAULT_PORTS[(protocol, security)]
    except ValueError:  # "imap://u@h:99999", "imap://u@h:abc"
        raise UsageError(f"bounces.mailbox.url: {url.netloc.rpartition('@')[2]!r} is no host:port") from None
    return MailboxSettings(
        protocol=protocol, host=url.hostname, port=port,
        user=unquote(url.username), password=section.password, folder=unquote(url.path.strip("/")) or "INBOX",
        security=security, verify=section.verify, ca_file=section.ca_file, after=after,
        interval=section.interval, timeout=section.timeout, unreadable=section.unreadable)


@dataclass
class Fetched:
    uid: str
    raw: bytes  # the message, or its first max_size + 1 bytes when it is larger (enough to say so)


class Mailbox:
    """One session: ``messages(max_size)`` to read them, ``done(uid)`` once one is applied."""

    def messages(self, max_size: int) -> Iterator[Fetched]:
        raise NotImplementedError

    def done(self, uid: str) -> None:
        raise NotImplementedError

    def set_aside(self, uid: str) -> bool:
        """A message that cannot be applied, put where an operator can look at it and fetch does
        not read it again; False where the protocol has nowhere to put it (POP3: it stays)."""
        return False


@contextmanager
def open_mailbox(settings: MailboxSettings, folder: Path) -> Iterator[Mailbox]:
    context = _tls_context(settings, folder)
    if settings.protocol == "imap":
        with _imap(settings, context) as box:
            yield box
    else:
        with _pop3(settings, context) as box:
            yield box


def _tls_context(settings: MailboxSettings, folder: Path) -> ssl.SSLContext | None:
    if settings.security == "none":
        return None
    context = ssl.create_default_context(cafile=str(folder / settings.ca_file) if settings.ca_file else None)
    if not settings.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class _Imap(Mailbox):
    def __init__(self, box, settings: MailboxSettings) -> None:
        self._box = box
        self._settings = settings

    def messages(self, max_size: int) -> Iterator[Fetched]:
        for uid in self._box.uids():
            # BODY.PEEK: the message stays unseen until it is applied; the bytes as stored, no more
            # of them than it takes to know one is too large (RFC 3501 partial fetch).
            status, data = self._box.client.uid("FETCH", uid, f"(BODY.PEEK[]<0.{max_size + 1}>)")
            raw = next((part[1] for part in data or () if isinstance(part, tuple)), None)
            if status == "OK" and raw is not None:
                yield Fetched(uid, raw)

    def done(self, uid: str) -> None:
        after = self._settings.after
        if after == "delete":
            self._box.delete(uid)
        else:
            self._box.move(uid, after.partition(":")[2])

    def set_aside(self, uid: str) -> bool:
        folder = self._settings.unreadable
        if not self._box.folder.exists(folder):
            self._box.folder.create(folder)
        self._box.move(uid, folder)
        return True


@contextmanager
def _imap(settings: MailboxSettings, context: ssl.SSLContext | None) -> Iterator[Mailbox]:
    from imap_tools import MailBox, MailBoxStartTls, MailBoxUnencrypted  # only `bounces fetch` needs them

    if settings.security == "tls":
        box = MailBox(settings.host, settings.port, timeout=settings.timeout, ssl_context=context)
    elif settings.security == "starttls":
        box = MailBoxStartTls(settings.host, settings.port, timeout=settings.timeout, ssl_context=context)
    else:
        box = MailBoxUnencrypted(settings.host, settings.port, timeout=settings.timeout)
    with box.login(settings.user, settings.password, initial_folder=settings.folder):
        yield _Imap(box, settings)


class _Pop3(Mailbox):
    def __init__(self, client: poplib.POP3) -> None:
        self._client = client

    def messages(self, max_size: int) -> Iterator[Fetched]:
        _, listing, _ = self._client.list()
        for line in listing:
            number, size = (int(v) for v in line.split()[:2])
            if size > max_size:
                # Not downloaded: its headers (which make it known, read again), padded past the
                # limit, stand for it: the parser says too large, and it is counted so.
                _, head, _ = self._client.top(number, 0)
                raw = (b"\r\n".join(head) + b"\r\n")[:max_size]
                yield Fetched(str(number), raw + b"\n" * (max_size + 1 - len(raw)))
                continue
            _, lines, _ = self._client.retr(number)
            yield Fetched(str(number), b"\r\n".join(lines) + b"\r\n")

    def done(self, uid: str) -> None:
        self._client.dele(int(uid))  # takes effect at QUIT: a crash before it deletes nothing


@contextmanager
def _pop3(settings: MailboxSettings, context: ssl.SSLContext | None) -> Iterator[Mailbox]:
    if settings.security == "tls":
        client: poplib.POP3 = poplib.POP3_SSL(settings.host, settings.port, timeout=settings.timeout, context=context)
    else:
        client = poplib.POP3(settings.host, settings.port, timeout=settings.timeout)
        if settings.security == "starttls":
            client.stls(context)
    try:
        client.user(settings.user)
        client.pass_(settings.password)
        yield _Pop3(client)
        client.quit()
    except BaseException:
        client.close()  # no QUIT: nothing marked for deletion is deleted
        raise



def mailbox_errors() -> tuple[type[BaseException], ...]:
    """What a mailbox session can fail with (the server, the network, TLS, a refused login)."""
    import imaplib

    from imap_tools.errors import ImapToolsError

    return (OSError, EOFError, poplib.error_proto, imaplib.IMAP4.error, ImapToolsError)
