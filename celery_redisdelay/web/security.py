"""The dashboard's guards: HTTP basic auth, CSRF tokens on every POST, read-only mode, and headers that
keep the pages from loading or being framed by anything outside the package.

The CSRF token is an HMAC of the app's secret (random per process unless one is configured, which
several processes behind one address need): a page of another site cannot read it, so it cannot make
a browser that holds the basic-auth credentials post an action. Every comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from flask import Response, abort, request

#: No script, style, image, fetch or form target outside the package; no framing.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def parse_auth(auth: str | tuple[str, str] | None) -> tuple[str, str] | None:
    """``user:password`` (the password may hold colons) as a pair; None for no auth."""
    if auth is None:
        return None
    if isinstance(auth, tuple):
        user, password = auth
    else:
        user, colon, password = auth.partition(":")
        if not colon:
            raise ValueError("auth must be given as user:password")
    if not user or not password:
        raise ValueError("auth needs a user and a password, neither empty")
    return user, password


@dataclass(frozen=True)
class Guard:
    """What the dashboard checks before every request and adds to every response."""

    secret: bytes
    auth: tuple[str, str] | None = None
    read_only: bool = False

    @property
    def csrf_token(self) -> str:
        return hmac.new(self.secret, b"redisdelay-dashboard-csrf", hashlib.sha256).hexdigest()

    def before_request(self) -> Response | None:
        """Ask for credentials when they are missing or wrong; refuse a POST in read-only mode (403) or
        without the CSRF token (400)."""
        if self.auth is not None and not self._authorized():
            return Response(
                "Authentication required.\n",
                401,
                {"WWW-Authenticate": 'Basic realm="redisdelay", charset="UTF-8"', "Content-Type": "text/plain"},
            )
        if request.method == "POST":
            if self.read_only:
                abort(403, "The dashboard is read-only (--read-only): it changes nothing.")
            token = request.form.get("csrf_token", "")
            if not hmac.compare_digest(token.encode(), self.csrf_token.encode()):
                abort(400, "The form's CSRF token is missing or wrong; reload the page and try again.")
        return None

    def _authorized(self) -> bool:
        assert self.auth is not None
        given = request.authorization
        if given is None or given.type != "basic":
            return False
        user_ok = hmac.compare_digest((given.username or "").encode(), self.auth[0].encode())
        password_ok = hmac.compare_digest((given.password or "").encode(), self.auth[1].encode())
        return user_ok and password_ok

    @staticmethod
    def after_request(response: Response) -> Response:
        for name, value in HEADERS.items():
            response.headers[name] = value  # over Flask's own (static files come with Cache-Control: no-cache)
        return response
