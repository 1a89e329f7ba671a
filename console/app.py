"""The console's web app: server-rendered pages over the cluster, and the admin actions.

Pages are Jinja2 templates with autoescaping on (``templates/``), so every value a page shows,
transaction keys and headers included, is escaped. The endpoints are plain functions: Starlette
runs them on its thread pool, where the SDK's blocking Kafka calls belong. See
:mod:`console.security` for sessions and CSRF.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from console import actions
from console.checks import ChecksRead, metrics_urls, read_checks
from console.health import NamespaceHealth, now_ms, read_health, read_members
from console.producers import groups_of, with_checks
from console.security import SESSION_COOKIE, Session, Sessions, same_origin
from console.settings import ConsoleSettings
from console.transactions import (
    expired_rows,
    pending_by_group,
    pending_rows,
    quarantined_rows,
    search_expired,
    search_pending,
    search_quarantined,
)
from txbridge import kafka
from txbridge.admin import list_expired, list_pending, list_producers, list_quarantine
from txbridge.errors import TxBridgeError
from txbridge.wire import Topics

__all__ = ["build_app", "discover_namespaces"]

logger = logging.getLogger(__name__)

_HERE = Path(__file__).parent
#: What a page may load: its own scripts and styles, nothing inline, no frames.
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_ROLE_TOPICS = ("_half", "_op", "_state")
_QUERY_CHARS = 200
_HEALTH_READERS = 4
#: A wrong admin token is answered this late: guessing one by trying is slow.
_WRONG_TOKEN_DELAY_S = 1.0
_FORM_TYPE = "application/x-www-form-urlencoded"
_FORM_BYTES = 16 * 1024


def discover_namespaces(bootstrap: str, extra: Any = None) -> list[str]:
    """The namespaces on the cluster: every prefix with a ``_half``, an ``_op`` and a ``_state`` topic."""
    try:
        names = set(kafka.admin(bootstrap, extra).list_topics(timeout=10).topics)
    except Exception as exc:
        raise kafka.to_error(exc, "listing the cluster's topics") from exc
    found = {n[: -len("_half")] for n in names if n.endswith("_half")}
    return sorted(ns for ns in found if all(f"{ns}{suffix}" in names for suffix in _ROLE_TOPICS))


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def _utc(ms: int | None) -> str:
    if not ms or ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.3g} s"


def _lag(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


class Console:
    """The app's state: the settings, the sessions and the templates."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.sessions = Sessions()
        self.templates = Environment(
            loader=FileSystemLoader(_HERE / "templates"),
            autoescape=select_autoescape(["html"], default=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters.update(age=_age, utc=_utc, lag=_lag, ms=_ms)

    # ------------------------------------------------------------------ plumbing

    def _session(self, request: Request) -> tuple[Session, bool]:
        session = self.sessions.get(request.cookies.get(SESSION_COOKIE))
        return (session, False) if session is not None else (self.sessions.new(), True)

    def _finish(self, request: Request, session: Session, response: Response, *, fresh: bool) -> Response:
        if fresh:
            response.set_cookie(
                SESSION_COOKIE,
                session.sid,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
                path="/",
            )
        response.headers.update(_SECURITY_HEADERS)
        return response

    def _page(
        self, request: Request, session: Session, fresh: bool, name: str, status: int = 200, **context: Any
    ) -> Response:
        template = self.templates.get_template(name)
        body = template.render(
            session=session,
            csrf=session.csrf,
            admin=session.admin and not self.settings.read_only,
            read_only=self.settings.read_only,
            flash=session.take_flash(),
            bootstrap=self.settings.bootstrap,
            namespaces=self._namespaces_or_empty(),
            now_ms=now_ms(),
            **context,
        )
        return self._finish(request, session, HTMLResponse(body, status), fresh=fresh)

    def _namespaces(self) -> list[str]:
        found = discover_namespaces(self.settings.bootstrap, self.settings.client)
        if self.settings.namespaces:
            return [ns for ns in self.settings.namespaces if ns in found]
        return found

    def _namespaces_or_empty(self) -> list[str]:
        try:
            return self._namespaces()
        except TxBridgeError:
            return []

    def _refuse(self, request: Request, session: Session, fresh: bool, why: str) -> Response:
        logger.warning("console: refused %s %s: %s", request.method, request.url.path, why)
        response = PlainTextResponse(f"403 refused: {why}\n", status_code=403)
        return self._finish(request, session, response, fresh=fresh)

    def _post_checks(self, request: Request, session: Session, form: Any) -> str | None:
        """Why a POST is refused (None: accepted): origin, then CSRF token."""
        own = f"{request.url.scheme}://{request.url.netloc}"
        if not same_origin(request.headers.get("origin"), request.headers.get("referer"), own):
            return "the request does not come from this console's pages (Origin/Referer)"
        token = form.get("csrf")
        if not session.csrf_ok(token if isinstance(token, str) else None):
            return "missing or wrong CSRF token: reload the page and try again"
        return None

    async def _form(self, request: Request) -> dict[str, str]:
        """A posted form's fields (the first value of each); anything but a small urlencoded
        form reads as empty, which the CSRF check then refuses. Parsed here: the forms are too
        plain to need python-multipart."""
        if request.headers.get("content-type", "").split(";")[0].strip() != _FORM_TYPE:
            return {}
        body = await request.body()
        if len(body) > _FORM_BYTES:
            return {}
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        return {name: values[0] for name, values in fields.items()}

    # ------------------------------------------------------------------ pages

    def health(self, request: Request) -> Response:
        session, fresh = self._session(request)
        try:
            namespaces = self._namespaces()
        except TxBridgeError as exc:
            return self._page(request, session, fresh, "health.html", 503, error=str(exc), healths=[])
        # Each namespace is several reads of the cluster, waiting on the network: side by side.
        with ThreadPoolExecutor(max_workers=_HEALTH_READERS, thread_name_prefix="console-health") as pool:
            healths = list(pool.map(self._health_of, namespaces))
        return self._page(request, session, fresh, "health.html", healths=healths, error="")

    def _health_of(self, ns: str) -> tuple[NamespaceHealth, int, int]:
        s = self.settings
        group = s.group_of(ns)
        problems = []
        try:
            pending = list_pending(s.bootstrap, ns, group, s.client)
        except TxBridgeError as exc:
            pending, problems = [], [str(exc)]
        health = read_health(s.bootstrap, ns, group, pending, s.client)
        try:
            expired = sum(1 for e in list_expired(s.bootstrap, ns, s.client) if e.resolved is None)
            quarantined = sum(1 for q in list_quarantine(s.bootstrap, ns, s.client) if q.requeued is None)
        except TxBridgeError as exc:
            expired = quarantined = 0
            problems.append(str(exc))
        health.error = "; ".join(p for p in [health.error, *problems] if p)
        return health, expired, quarantined

    def _known(self, ns: str) -> bool:
        return ns in self._namespaces_or_empty()

    def transactions(self, request: Request) -> Response:
        session, fresh = self._session(request)
        ns = request.path_params["ns"]
        if not self._known(ns):
            return self._page(request, session, fresh, "missing.html", 404, namespace=ns)
        query = request.query_params.get("q", "")[:_QUERY_CHARS]
        s = self.settings
        try:
            pending = pending_rows(list_pending(s.bootstrap, ns, s.group_of(ns), s.client))
            expired = expired_rows(list_expired(s.bootstrap, ns, s.client))
            quarantined = quarantined_rows(list_quarantine(s.bootstrap, ns, s.client))
        except TxBridgeError as exc:
            return self._page(request, session, fresh, "transactions.html", 503, namespace=ns, error=str(exc))
        return self._page(
            request,
            session,
            fresh,
            "transactions.html",
            namespace=ns,
            topics=Topics(ns),
            query=query,
            pending=pending_by_group(search_pending(pending, query)),
            pending_total=len(pending),
            expired=list(reversed(search_expired(expired, query))),  # newest first
            expired_total=len(expired),
            quarantined=list(reversed(search_quarantined(quarantined, query))),
            quarantined_total=len(quarantined),
            error="",
        )

    def producers(self, request: Request) -> Response:
        session, fresh = self._session(request)
        ns = request.path_params["ns"]
        if not self._known(ns):
            return self._page(request, session, fresh, "missing.html", 404, namespace=ns)
        s = self.settings
        try:
            registered = list_producers(s.bootstrap, ns, s.client)
            pending = pending_rows(list_pending(s.bootstrap, ns, s.group_of(ns), s.client))
            expired = expired_rows(list_expired(s.bootstrap, ns, s.client))
        except TxBridgeError as exc:
            return self._page(request, session, fresh, "producers.html", 503, namespace=ns, error=str(exc))
        groups = groups_of(registered, pending, expired, now_ms(), s.liveness_s)
        checks = self._checks_of(ns)
        return self._page(
            request,
            session,
            fresh,
            "producers.html",
            namespace=ns,
            groups=with_checks(groups, checks.by_group),
            checks=checks,
            liveness_s=s.liveness_s,
            error="",
        )

    def _checks_of(self, ns: str) -> ChecksRead:
        """The check figures of ``ns``'s coordinators, from their metrics where the console was told
        they are; what could not be read is listed, never raised: the page is shown without it."""
        s = self.settings
        where = s.metrics_of(ns)
        if not where:
            return ChecksRead()
        members = []
        if any(one.isdigit() for one in where):
            try:
                members = read_members(s.bootstrap, s.group_of(ns), Topics(ns).half, s.client)[1]
            except TxBridgeError as exc:
                failed = ChecksRead(configured=True)
                failed.unavailable.append((f"the members of {s.group_of(ns)}", str(exc)))
                return failed
        return read_checks(metrics_urls(where, members), ns)

    def login_page(self, request: Request) -> Response:
        session, fresh = self._session(request)
        return self._page(request, session, fresh, "login.html")

    async def login(self, request: Request) -> Response:
        session, fresh = self._session(request)
        form = await self._form(request)
        refused = self._post_checks(request, session, form)
        if refused is not None:
            return self._refuse(request, session, fresh, refused)
        token = self.settings.admin_token
        if token is None:
            session.say("error", "this console is read-only: it was started without an admin token")
            return self._finish(request, session, RedirectResponse("/", 303), fresh=fresh)
        if not token.matches(form.get("token", "")):
            logger.warning("console: a sign-in with a wrong admin token from %s", request.client)
            await asyncio.sleep(_WRONG_TOKEN_DELAY_S)
            session.say("error", "wrong admin token")
            return self._finish(request, session, RedirectResponse("/login", 303), fresh=fresh)
        signed_in = self.sessions.renew(session, admin=True)
        signed_in.say("ok", "signed in as admin: actions are enabled")
        logger.info("console: admin signed in from %s", request.client)
        return self._finish(request, signed_in, RedirectResponse("/", 303), fresh=True)

    async def logout(self, request: Request) -> Response:
        session, fresh = self._session(request)
        form = await self._form(request)
        refused = self._post_checks(request, session, form)
        if refused is not None:
            return self._refuse(request, session, fresh, refused)
        anonymous = self.sessions.renew(session, admin=False)
        anonymous.say("ok", "signed out: the console is read-only for you")
        return self._finish(request, anonymous, RedirectResponse("/", 303), fresh=True)

    # ------------------------------------------------------------------ actions

    async def _action(
        self, request: Request, run: Callable[[str, dict[str, str]], list[actions.Outcome]]
    ) -> Response:
        """A POSTed action: origin, CSRF token and admin checked, then ``run(namespace, form)``
        on the thread pool; its outcome is shown once on the transactions page (post/redirect/get)."""
        session, fresh = self._session(request)
        form = await self._form(request)
        refused = self._post_checks(request, session, form)
        if refused is None and (self.settings.read_only or not session.admin):
            refused = "actions need the admin token: sign in first" + (
                " (this console is read-only)" if self.settings.read_only else ""
            )
        if refused is not None:
            return self._refuse(request, session, fresh, refused)
        ns = request.path_params["ns"]
        if not await run_in_threadpool(self._known, ns):
            return self._refuse(request, session, fresh, f"no namespace {ns} on this cluster")
        for kind, text in await run_in_threadpool(run, ns, form):
            session.say(kind, text)
        back = f"/ns/{ns}/transactions"
        if form.get("q"):
            back += "?" + urlencode({"q": form["q"][:_QUERY_CHARS]})
        return self._finish(request, session, RedirectResponse(back, 303), fresh=fresh)

    async def resolve(self, request: Request) -> Response:
        s, tx_id = self.settings, request.path_params["tx"]
        return await self._action(
            request,
            lambda ns, form: [
                actions.resolve_expired(s.bootstrap, ns, tx_id, form.get("state", ""), s.client)
            ],
        )

    async def requeue(self, request: Request) -> Response:
        s, tx_id = self.settings, request.path_params["tx"]
        return await self._action(
            request, lambda ns, _form: [actions.requeue_one(s.bootstrap, ns, tx_id, s.client)]
        )

    async def redrive(self, request: Request) -> Response:
        s = self.settings
        return await self._action(request, lambda ns, _form: actions.redrive_all(s.bootstrap, ns, s.client))


_NS = "{ns:str}"


def _failed(request: Request, exc: Exception) -> Response:
    """A page that failed for a reason not foreseen: logged whole, answered in one line (no
    traceback, nothing of the settings)."""
    logger.error("console: %s %s failed", request.method, request.url.path, exc_info=exc)
    text = f"500: {type(exc).__name__}: {exc}" if isinstance(exc, TxBridgeError) else "500: internal error"
    response = PlainTextResponse(f"{text}; the console's log has the details; reload to try again\n", 500)
    response.headers.update(_SECURITY_HEADERS)
    return response


def build_app(settings: ConsoleSettings) -> Starlette:
    """The console's ASGI app (serve it with uvicorn: ``txbridge console`` does)."""
    console = Console(settings)
    routes = [
        Route("/", console.health),
        Route("/healthz", lambda _request: PlainTextResponse("ok\n")),
        Route(f"/ns/{_NS}/transactions", console.transactions),
        Route(f"/ns/{_NS}/producers", console.producers),
        Route("/login", console.login_page, methods=["GET"]),
        Route("/login", console.login, methods=["POST"]),
        Route("/logout", console.logout, methods=["POST"]),
        Route(f"/ns/{_NS}/expired/{{tx:str}}/resolve", console.resolve, methods=["POST"]),
        Route(f"/ns/{_NS}/quarantine/{{tx:str}}/requeue", console.requeue, methods=["POST"]),
        Route(f"/ns/{_NS}/quarantine/redrive", console.redrive, methods=["POST"]),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    # A page served under another host name (DNS rebinding) is refused before any route runs.
    return Starlette(
        routes=routes,
        exception_handlers={Exception: _failed},
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(settings.allowed_hosts))],
    )
