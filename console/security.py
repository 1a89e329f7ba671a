"""Sessions, the admin login and CSRF protection, apart from the pages so they are tested alone.

Every visitor gets a session (a random id in an HttpOnly, ``SameSite=Strict`` cookie) holding a
CSRF token and whether it signed in with the admin token. A state-changing request (every POST)
is accepted only when all of these hold:

- its ``Origin`` header, or without one its ``Referer``, is the console's own origin (a request
  with neither is refused: browsers send ``Origin`` on every cross-site POST and on same-origin
  form posts);
- its form carries the session's CSRF token (compared in constant time);
- for an action, the session signed in with the admin token.

Sessions live in this process's memory only: a restart signs everybody out, which is the safe
side for an admin credential. :func:`shown_url` is how any URL reaches a page: without the
credentials, query or fragment it may carry.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

__all__ = ["SESSION_COOKIE", "Session", "Sessions", "same_origin", "shown_url"]

SESSION_COOKIE = "txbridge_console"
#: A session unused this long is forgotten (an admin signs in again).
SESSION_IDLE_S = 8 * 3600
#: Sessions kept at most; the least recently used go first (a flood of anonymous visits
#: cannot grow the process without bound).
MAX_SESSIONS = 10_000


@dataclass
class Session:
    """One visitor: its CSRF token, whether it is the admin, and the message of its last action."""

    sid: str
    csrf: str
    admin: bool = False
    flash: list[tuple[str, str]] = field(default_factory=list)  # (kind, text), shown once
    used: float = field(default_factory=time.monotonic)

    def csrf_ok(self, offered: str | None) -> bool:
        return offered is not None and hmac.compare_digest(self.csrf.encode(), offered.encode())

    def say(self, kind: str, text: str) -> None:
        self.flash.append((kind, text))

    def take_flash(self) -> list[tuple[str, str]]:
        out, self.flash = self.flash, []
        return out


class Sessions:
    """The sessions of this process (thread-safe: pages are served on a thread pool)."""

    def __init__(self, idle_s: float = SESSION_IDLE_S, limit: int = MAX_SESSIONS) -> None:
        self._idle_s = idle_s
        self._limit = limit
        self._by_id: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, sid: str | None) -> Session | None:
        """The live session of cookie value ``sid``, or None."""
        if not sid:
            return None
        now = time.monotonic()
        with self._lock:
            session = self._by_id.get(sid)
            if session is None:
                return None
            if now - session.used > self._idle_s:
                del self._by_id[sid]
                return None
            session.used = now
            self._by_id.move_to_end(sid)
            return session

    def new(self) -> Session:
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32))
        with self._lock:
            self._by_id[session.sid] = session
            while len(self._by_id) > self._limit:
                self._by_id.popitem(last=False)
        return session

    def renew(self, old: Session, *, admin: bool) -> Session:
        """A fresh session (new id, new CSRF token) replacing ``old``: at sign-in and sign-out, so
        a session id known before the sign-in (session fixation) is worth nothing after it."""
        with self._lock:
            self._by_id.pop(old.sid, None)
        session = self.new()
        session.admin = admin
        session.flash = old.flash
        return session


def same_origin(origin: str | None, referer: str | None, own: str) -> bool:
    """Whether a POST comes from the console's own pages: its Origin (else its Referer) is ``own``.

    Args:
        origin: the ``Origin`` header (``"null"`` from sandboxed or privacy-restricted contexts).
        referer: the ``Referer`` header.
        own: the console's origin as the browser addresses it, ``scheme://host[:port]``.
    """
    if origin:
        return origin == own
    if referer:
        parts = urlsplit(referer)
        return f"{parts.scheme}://{parts.netloc}" == own
    return False


def shown_url(url: str) -> str:
    """A check URL as a page may show it: without credentials, query or fragment (a token may hide there)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(not a URL)"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
