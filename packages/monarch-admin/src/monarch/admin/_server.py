"""The admin HTTP server: a live job's hosts, procs, actors and stacks as JSON.

A stdlib ``ThreadingHTTPServer`` in the client, on a thread of its own; each request
asks the procs then and there (``JobView``), so an idle server costs the job nothing.
Every request carries the server's token (``Authorization: Bearer``, or ``?token=``),
else ``401``; whatever goes wrong in a request is a JSON answer with a 4xx or 5xx
status, never the client's end.

Routes (upstream's reference-walking admin API, plus ours): ``/`` the dashboard page,
``/openapi.json``, ``/v1/root``, ``/v1/tree`` (text), ``/v1/snapshot`` (the whole job),
``/v1/stacks/<ref>`` (a proc's Python stacks), ``/v1/query?sql=`` (the job's telemetry
tables), ``/v1/trace`` (the job's timeline from them, Chrome trace-event JSON),
``/v1/profile?seconds=`` (every proc here sampled by py-spy, on that timeline),
``/v1/<ref>`` (a node).
"""

from __future__ import annotations

import atexit
import errno
import json
import logging
import socket
import sys
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from monarch.core import current_config, current_runtime

from ._auth import new_token, remove_token, token_matches, write_token
from ._discovery import remove_record, write_record
from ._openapi import openapi
from ._profile import check, sample
from ._view import ROOT, JobView, NotAnswering, NotFound, tree_text

log = logging.getLogger("monarch.admin")

UPSTREAM_DEFAULT: Final = "[::]:1729"
"""``mesh_admin_addr``'s default (upstream's): ours then listens on loopback only."""
LOOPBACK_DEFAULT: Final = ("127.0.0.1", 1729)

Query = Callable[[str], Any]
"""SQL over the job's telemetry tables: ``{"rows": [...]}`` (monarch-telemetry's), a list of
rows, or a pyarrow table."""


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``; port 0 picks a free one) as a (host, port) pair."""
    host, sep, port = addr.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"admin address must be HOST:PORT (such as 127.0.0.1:1729), not {addr!r}")
    return host or "0.0.0.0", int(port)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    admin: AdminServer


class AdminServer:
    """An admin HTTP server over this client's job (see the module docstring).

    ``addr`` ``None`` is the ``mesh_admin_addr`` key; at its default (upstream's
    ``[::]:1729``) the server listens on ``127.0.0.1:1729``, or on a free port when that
    one is taken. ``token`` ``None`` makes one. ``timeout``: seconds a proc has to answer.
    ``query``: runs SQL for ``/v1/query``; ``None``: the tables of this client's
    ``enable_telemetry()`` (monarch-telemetry), whenever it was or will be called. ``job``:
    the saved job this client attached through (``None``: the one monarch-jobs' ``state()``
    last attached through, if any), for ``monarch query`` to find the server of a context.
    """

    def __init__(
        self,
        addr: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 2.0,
        query: Query | None = None,
        job: str | None = None,
    ) -> None:
        self.token = token or new_token()
        self.view = JobView(timeout)
        self.query = query
        self.last_profile: dict[str, Any] | None = None
        """What the last ``/v1/profile`` answered, served again at ``/v1/profile/last`` (the
        dashboard links it, for ui.perfetto.dev)."""
        fallback = False
        if addr is None:
            addr = current_config().mesh_admin_addr
            fallback = addr == UPSTREAM_DEFAULT
        host, port = LOOPBACK_DEFAULT if fallback else parse_addr(addr)
        current_runtime()  # the job's runtime runs before the first request
        try:
            self._http = _bind(host, port)
        except OSError as exc:
            if not (fallback and exc.errno == errno.EADDRINUSE):
                why = f"admin server cannot listen on {host}:{port}: {exc.strerror}"
                raise OSError(exc.errno, why) from None
            self._http = _bind(host, 0)
        self._http.admin = self
        self.host, self.port = str(self._http.server_address[0]), int(self._http.server_address[1])
        try:
            self.token_path: Path | None = write_token(self.port, self.token)
        except OSError as exc:  # a home that cannot be written: the printed token still works
            log.warning("admin server: cannot write its token file: %s", exc)
            self.token_path = None
        self.job = job if job is not None else _attached_job()
        if self.token_path is not None:
            try:
                write_record(self.host, self.port, self.job)
            except OSError as exc:
                log.warning("admin server: cannot write its discovery record: %s", exc)
        atexit.register(self._forget_token)  # a client that ends without close()
        self._thread = threading.Thread(
            target=self._http.serve_forever, name="monarch-admin", daemon=True
        )
        self._thread.start()
        self._closed = False
        self._busy = threading.Condition()
        self._answering = 0
        """Requests being answered; close() waits for them."""

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (a wildcard address shown as this machine's name)."""
        host = self.host
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def addr(self) -> str:
        """``HOST:PORT``, as ``monarch top --addr`` takes it."""
        return self.url.removeprefix("http://")

    def announce(self) -> None:
        """Say where the server is and its token (stderr)."""
        where = f"; token in {self.token_path}" if self.token_path is not None else ""
        print(
            f"monarch admin: {self.url}/?token={self.token}  "
            f"(monarch top --addr {self.addr}{where})",
            file=sys.stderr,
        )

    def close(self) -> None:
        """Stop serving: the requests being answered finish first (a job that goes on to
        stop its meshes must not show them half stopped), later ones on open connections
        are refused."""
        with self._busy:
            if self._closed:
                return
            self._closed = True
        self._http.shutdown()
        self._http.server_close()
        with self._busy:
            self._busy.wait_for(lambda: self._answering == 0, timeout=self.view.timeout + 5)
        atexit.unregister(self._forget_token)
        self._forget_token()

    def _forget_token(self) -> None:
        if self.token_path is not None:
            remove_token(self.port, self.token)
            remove_record(self.port)

    def query_function(self) -> Query | None:
        """What answers ``/v1/query``: the one given, else this client's telemetry tables
        (looked up on each request: ``enable_telemetry()`` may come after ``start_admin()``)."""
        if self.query is not None:
            return self.query
        telemetry = sys.modules.get("monarch.telemetry")
        tables: Callable[[], Query | None] | None = getattr(telemetry, "job_query", None)
        return tables() if tables is not None else None

    def __enter__(self) -> AdminServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests -----------------------------------------------------------------------

    def admit(self) -> bool:
        """Count a request in (False once closed); ``done()`` counts it out."""
        with self._busy:
            if self._closed:
                return False
            self._answering += 1
            return True

    def done(self) -> None:
        with self._busy:
            self._answering -= 1
            self._busy.notify_all()

    def accepted(self) -> tuple[str, ...]:
        try:
            secret = current_runtime().secret.hex()
        except RuntimeError:
            return (self.token,)
        return (self.token, secret)

    def respond(self, request: _Handler) -> None:
        """Answer one GET (on the request's thread)."""
        parts = urlsplit(request.path)
        params = parse_qs(parts.query)
        given = _bearer(request.headers.get("Authorization", "")) or params.get("token", [""])[0]
        if not given or not token_matches(given, self.accepted()):
            request.send_json(HTTPStatus.UNAUTHORIZED, {"error": "a valid token is required"})
            return
        path = parts.path
        if path in ("/", "/index.html"):
            request.send_text(HTTPStatus.OK, _dashboard(), "text/html; charset=utf-8")
        elif path == "/openapi.json":
            request.send_json(HTTPStatus.OK, openapi())
        elif path == "/v1/tree":
            text = tree_text(self.view.collect())
            request.send_text(HTTPStatus.OK, text, "text/plain; charset=utf-8")
        elif path == "/v1/snapshot":
            request.send_json(HTTPStatus.OK, self.view.collect())
        elif path.startswith("/v1/stacks/"):
            ref = _ref(path.removeprefix("/v1/stacks/"))
            source = params.get("source", ["auto"])[0]
            request.send_json(HTTPStatus.OK, self.view.stacks(ref, source))
        elif path == "/v1/query":
            request.send_json(HTTPStatus.OK, self._query(params))
        elif path == "/v1/trace":
            request.send_json(HTTPStatus.OK, self._trace())
        elif path == "/v1/profile":
            request.send_json(HTTPStatus.OK, self._profile(params))
        elif path == "/v1/profile/last":
            if self.last_profile is None:
                raise NotFound("no profile taken yet (monarch profile)")
            request.send_json(HTTPStatus.OK, self.last_profile)
        elif path.startswith("/v1/"):
            ref = _ref(path.removeprefix("/v1/"))
            node = self.view.node(ref)
            if ref == ROOT:
                node["properties"]["telemetry"] = self.query_function() is not None
                node["properties"]["last_profile"] = self.last_profile is not None
            request.send_json(HTTPStatus.OK, node)
        else:
            raise NotFound(path)

    def _profile(self, params: dict[str, list[str]]) -> Any:
        """Every live proc sampled by py-spy at once, and by the torch profiler with
        ``torch=1`` (``_profile``), on the tracks of the job's timeline where it keeps
        telemetry tables."""
        try:
            seconds = float(params.get("seconds", ["5"])[0])
            rate = int(params.get("rate", ["100"])[0])
        except ValueError:
            raise ValueError("seconds and rate are numbers: ?seconds=5&rate=100") from None
        idle = params.get("idle", ["0"])[0] in ("1", "true")
        torch = params.get("torch", ["0"])[0] in ("1", "true")
        check(seconds, rate)
        self.view.collect()  # what each proc said of itself: its host's name
        procs = [p for p in self.view.procs() if p.address and p.exited is None]
        try:
            profile = sample(procs, seconds, rate, idle, torch)
        except LookupError as exc:
            raise NotFound(str(exc)) from None
        events = list(profile.events)
        if self.query_function() is not None:
            events = self._trace()["traceEvents"] + events
        self.last_profile = {
            "traceEvents": events,
            "stacks": profile.stacks,
            "notes": profile.notes,
        }
        return self.last_profile

    def _trace(self) -> Any:
        """The job's timeline (Chrome trace-event JSON), from its telemetry tables."""
        query = self._tables()
        telemetry = sys.modules.get("monarch.telemetry")
        trace: Callable[[Query], Any] | None = getattr(telemetry, "perfetto_trace", None)
        if trace is None:
            raise NotFound("no timeline: monarch-telemetry is not loaded in the job's client")
        return trace(query)

    def _query(self, params: dict[str, list[str]]) -> Any:
        query = self._tables()
        sql = params.get("sql", [""])[0]
        if not sql.strip():
            raise ValueError("/v1/query needs ?sql=SELECT ...")
        try:
            result = query(sql)
        except Exception as exc:  # noqa: BLE001 - a query that cannot run is a bad request
            raise ValueError(str(exc)) from None
        if isinstance(result, dict):
            return result
        if hasattr(result, "to_pylist"):
            result = result.to_pylist()
        return {"rows": result}

    def _tables(self) -> Query:
        query = self.query_function()
        if query is None:
            raise NotFound(
                "no telemetry tables: this job's client did not call enable_telemetry() "
                "(monarch.telemetry, or job.enable_telemetry() before job.state())"
            )
        return query


def _attached_job() -> str | None:
    """The saved job monarch-jobs' ``state()`` attached this client through, if it did."""
    job_module = sys.modules.get("monarch.job")  # imported by any job's client
    attached: Callable[[], str | None] | None = getattr(job_module, "attached_job_file", None)
    return attached() if attached is not None else None


def _bind(host: str, port: int) -> _HTTPServer:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("_Server", (_HTTPServer,), {"address_family": family})
    return server_class((host, port), _Handler)  # type: ignore[no-any-return]


def _bearer(header: str) -> str:
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _ref(text: str) -> str:
    """A reference as a path segment gives it: URL-decoded, whole."""
    ref = unquote(text, errors="strict")
    if not ref or "\x00" in ref:
        raise ValueError(f"not a reference: {text!r}")
    return ref


def _dashboard() -> str:
    return (resources.files("monarch.admin") / "dashboard.html").read_text(encoding="utf-8")


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "monarch-admin"

    def do_GET(self) -> None:
        admin = self.server.admin
        if not admin.admit():  # a keep-alive connection outliving close()
            self.close_connection = True
            self.send_json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "admin server closed"})
            return
        try:
            self._answer()
        finally:
            admin.done()

    def _answer(self) -> None:
        try:
            self.server.admin.respond(self)
        except NotFound as exc:
            self.send_json(HTTPStatus.NOT_FOUND, {"error": f"not found: {exc}"})
        except NotAnswering as exc:
            self.send_json(HTTPStatus.GATEWAY_TIMEOUT, {"error": f"not answering: {exc}"})
        except (ValueError, UnicodeDecodeError) as exc:
            self.send_json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:
            log.exception("admin request %s failed", self.path)
            error = f"{type(exc).__name__}: {exc}"
            self.send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": error})

    def _refuse_method(self) -> None:
        error = f"{self.command} is not served; use GET"
        self.send_json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": error})

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse_method

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib's answer to a request it cannot read, as JSON."""
        self.close_connection = True
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = "HTTP/1.0"  # a status line and headers, whatever it sent
        status = HTTPStatus(code)
        self.send_json(status, {"error": message or status.phrase})

    def send_json(self, status: HTTPStatus, body: Any) -> None:
        self.send_text(status, json.dumps(body, default=str), "application/json")

    def send_text(self, status: HTTPStatus, text: str, content_type: str) -> None:
        data = text.encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("admin %s: " + format, self.address_string(), *args)
