"""Service state shared by replicas in a Redis-protocol store (Valkey or Redis): ``ragate serve --state
redis://HOST:PORT/DB``, ``Pipeline(state=URL)``.

N replicas of ``ragate serve`` behind a load balancer each hold their own live budget controller; without a shared
window the fleet's retrieval rate is only the average of N independent controllers. With ``--state`` the
controller's window (the last W gate scores and decisions, over all replicas) and its tau live in the store:
each answered request pushes its score and decision and reads the window back in one transaction, and each request
reads tau from it, so every replica sets its threshold from the fleet's traffic.

The store is a side channel: when it cannot be reached, the replica keeps answering, sets tau from its own copy of
the last window it read plus what it observed since (the controller reports ``shared_error``; ``/healthz`` says
"degraded: shared state: ..."), tries the store again at most once per :data:`RETRY_SECONDS`, and on re-joining
pushes what it observed meanwhile; a store that comes back empty (restarted without persistence) is seeded with the
replica's own window first, so tau does not restart from a handful of requests. A service checks the store on its own
timer (:meth:`ragate.state.budget.BudgetController.watch`), so ``/healthz`` sees an outage without a request. A URL that is
wrong, a store that cannot be reached, or a store in cluster mode (the window's keys are read in one transaction on
one node; use a single primary with replicas, or a proxy) is refused at start. Each store command waits at most
``?timeout=SECONDS`` of the URL (default :data:`TIMEOUT_SECONDS`).

Keys, under ``ragate:budget:<digest of method and model>:``: ``scores`` and ``decisions`` (lists, newest first,
trimmed to W), ``tau`` (a string), ``seen`` (how many observations were ever pushed), ``tau_seen`` (the ``seen`` of
the window ``tau`` was computed from: a replica sets tau only from a window at least as new, so two replicas that
push and then set tau in either order leave the newer window's), ``meta`` (a hash whose ``settings`` field holds
method, model, budget, window and gain as JSON). Replicas that share a key must share ``--budget``, ``--window`` and ``--budget-gain`` (checked at
start). Values read back are checked: an entry that is not a
finite number (or 0/1) is skipped, so a damaged key cannot put NaN into tau.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit, urlunsplit

from ragate.errors import RagateError

log = logging.getLogger(__name__)

SCHEMES = ("redis", "rediss", "valkey", "valkeys")
RETRY_SECONDS = 1.0  # while the store is down, one try per this long (a request never waits on a dead store twice)
TIMEOUT_SECONDS = 0.5  # connect and socket timeout of one store command (the URL's ?timeout= changes it)
MAX_TIMEOUT_SECONDS = 60.0


class StoreUnavailable(RagateError):
    """The shared store did not answer (or answered with an error); the caller falls back to local state."""


@dataclass(frozen=True)
class StateURL:
    """A checked ``--state`` URL: ``redis://[user:password@]host:port/db[?timeout=SECONDS]`` (``valkey://`` the
    same; ``rediss://`` and ``valkeys://`` over TLS); ``timeout``: how long one store command may take."""

    url: str
    host: str
    port: int
    db: int
    tls: bool
    timeout: float = TIMEOUT_SECONDS

    @property
    def shown(self) -> str:
        """The URL without its password, for messages and /healthz."""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{self.host}:{self.port}/{self.db}"


def parse_state_url(text: str) -> StateURL:
    """Check a ``--state`` value, naming what is wrong and the form it takes."""
    form = "give --state redis://HOST:PORT/DB (or valkey://...), e.g. redis://127.0.0.1:6379/0"
    if not isinstance(text, str) or not text.strip():
        raise RagateError(f"--state is empty; {form}")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as err:
        raise RagateError(f"--state {text!r} is not a URL ({err}); {form}") from None
    if parts.scheme not in SCHEMES:
        raise RagateError(f"--state {text!r}: the scheme must be one of {', '.join(SCHEMES)}; {form}")
    if not parts.hostname:
        raise RagateError(f"--state {text!r} names no host; {form}")
    path = parts.path.strip("/") or "0"
    if not path.isdigit() or int(path) > 15:
        raise RagateError(f"--state {text!r}: the database must be a number 0-15, got {path!r}; {form}")
    if parts.fragment:
        raise RagateError(f"--state {text!r}: no fragment is read; {form}")
    query = parse_qs(parts.query, keep_blank_values=True) if parts.query else {}
    if set(query) - {"timeout"} or len(query.get("timeout", [])) > 1:
        raise RagateError(f"--state {text!r}: the one query read is ?timeout=SECONDS (one store command's limit)")
    timeout = TIMEOUT_SECONDS
    if "timeout" in query:
        try:
            timeout = float(query["timeout"][0])
        except ValueError:
            timeout = math.nan
        if not 0 < timeout <= MAX_TIMEOUT_SECONDS:
            raise RagateError(
                f"--state {text!r}: timeout must be seconds in (0, {MAX_TIMEOUT_SECONDS:g}], got "
                f"{query['timeout'][0]!r:.20}"
            )
    plain = urlunsplit(parts._replace(query=""))  # what the client reads: no option it does not know
    return StateURL(plain, parts.hostname, port or 6379, int(path), parts.scheme in ("rediss", "valkeys"), timeout)


def connect(url: StateURL, *, timeout: float | None = None) -> Any:
    """A client of the store (the ``valkey`` package, which speaks to Valkey and Redis alike), pinged once: a
    store that does not answer, or runs in cluster mode, is refused here, naming the URL and the fix. ``timeout``:
    each command's (default the URL's)."""
    try:
        import valkey
    except ImportError:
        raise RagateError(
            "--state needs the valkey client: pip install 'ragate[state]' (or pip install valkey)"
        ) from None
    client = valkey.Valkey.from_url(
        url.url.replace("valkey", "redis", 1) if url.url.startswith("valkey") else url.url,
        socket_timeout=timeout or url.timeout, socket_connect_timeout=url.timeout, decode_responses=True,
        encoding_errors="replace",  # a damaged value is text that does not parse, never a decoding exception
    )  # fmt: skip
    try:
        client.ping()
    except valkey.exceptions.ValkeyError as err:
        client.close()
        said = f"{type(err).__name__}: {err}"
        if isinstance(err, (valkey.exceptions.AuthenticationError, valkey.exceptions.AuthorizationError)) or any(
            code in str(err) for code in ("NOAUTH", "WRONGPASS", "NOPERM")
        ):
            raise RagateError(
                f"--state {url.shown}: the store refused the credentials ({said}); give them in the URL: "
                "redis://:PASSWORD@HOST:PORT/DB, or redis://USER:PASSWORD@... for an ACL user"
            ) from None
        raise RagateError(
            f"--state {url.shown}: the store does not answer ({said}); start Valkey or Redis there "
            "(valkey-server / redis-server) or fix the URL"
        ) from None
    try:
        cluster = cast("dict[str, Any]", client.info("cluster")).get("cluster_enabled")
    except valkey.exceptions.ValkeyError:  # INFO not allowed to this user: a cluster fails at the first write
        cluster = None
    if str(cluster) == "1":
        client.close()
        raise RagateError(
            f"--state {url.shown} is a node of a Valkey/Redis cluster: ragate reads and writes the budget window's "
            "keys in one transaction on one node, which cluster mode does not serve; give a single primary (with "
            "replicas for failover, e.g. Sentinel's current primary) or a proxy in front of the cluster"
        )
    return client


def _numbers(values: Sequence[str]) -> list[float]:
    out = []
    for v in values:
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x):
            out.append(x)
    return out


def _number(value: str | None) -> float | None:
    found = _numbers([value]) if value is not None else []
    return found[0] if found else None


# tau as computed from the window after the observation numbered ARGV[2]: set only if no replica has set one from a
# later window (two replicas push, then set tau in either order: the later window's tau stays)
_SET_TAU = """
local at = tonumber(redis.call('GET', KEYS[2]) or '-1') or -1
local seen = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
if at > seen then at = -1 end  -- the count was lost (evicted, deleted, a restart between push and tau): start again
if tonumber(ARGV[2]) < at then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""

# a store that came back empty (restarted without persistence) takes a re-joining replica's window: ARGV = the
# settings, W, the number of scores, the scores oldest first, the decisions oldest first; -1 where it holds a window
_SEED = """
if redis.call('LLEN', KEYS[3]) > 0 then return -1 end
redis.call('HSETNX', KEYS[1], 'settings', ARGV[1])
local n = tonumber(ARGV[3])
for i = 1, n do redis.call('LPUSH', KEYS[2], ARGV[3 + i]) end
local m = #ARGV - 3 - n
for i = 1, m do redis.call('LPUSH', KEYS[3], ARGV[3 + n + i]) end
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[2]) - 1)
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[2]) - 1)
return redis.call('INCRBY', KEYS[4], m)
"""


class SharedWindow:
    """The budget controller's window in the store (see the module docstring). Every method raises
    :class:`StoreUnavailable` when the store fails; the controller decides what to do then."""

    def __init__(
        self, url: StateURL, *, method: str, model: str, budget: float, window: int, gain: float = 16.0
    ) -> None:
        """Connect and claim (or join) the window of ``method`` on ``model``: the first replica writes the settings
        (one field, atomically); a replica with other settings is refused. Check the settings before this."""
        self.url, self.window = url, window
        self._client = connect(url)
        self._set_tau = self._client.register_script(_SET_TAU)
        self._seed = self._client.register_script(_SEED)
        self.seen = 0  # the number of the last observation of the fleet this replica's view of the window includes
        digest = hashlib.sha256(f"{method}\0{model}".encode()).hexdigest()[:16]
        self.prefix = f"ragate:budget:{digest}:"
        mine = {"method": method, "model": model, "budget": budget, "window": window, "gain": gain}
        self._settings = json.dumps(mine, sort_keys=True)
        try:
            self._client.script_load(_SET_TAU)  # a store that refuses scripts (an ACL) is refused here
            self._client.hsetnx(self.prefix + "meta", "settings", json.dumps(mine, sort_keys=True))
            saved = self._client.hget(self.prefix + "meta", "settings")
        except Exception as err:  # noqa: BLE001 (any failure of the store at start: refused, naming it)
            self._client.close()
            raise RagateError(
                f"--state {url.shown}: {type(err).__name__}: {err} (a replica reads, writes and runs scripts there)"
            ) from None
        try:
            theirs = json.loads(saved or "")
        except ValueError:
            theirs = None
        if theirs != mine:
            self._client.close()
            raise RagateError(
                f"--state {url.shown} holds the budget window of {method!r} on this model with the settings "
                f"{saved!r:.200}; this replica has {json.dumps(mine, sort_keys=True)}: replicas that share a store "
                "must share --budget, --window and --budget-gain (or use another database in the URL)"
            )

    def _run(self, build: Any) -> list[Any]:
        try:
            pipe = self._client.pipeline(transaction=True)
            build(pipe)
            return list(pipe.execute())
        except Exception as err:  # noqa: BLE001 (a side channel: whatever the store does, the answer goes on)
            raise StoreUnavailable(f"{type(err).__name__}: {err}") from None

    def push(self, entries: Sequence[tuple[float | None, bool]]) -> tuple[list[float], list[bool]]:
        """Add observations (score or None, retrieved) in order; the window after them, oldest first."""
        scores, decisions = self.prefix + "scores", self.prefix + "decisions"

        def build(pipe: Any) -> None:
            for score, retrieved in entries:
                if score is not None and math.isfinite(score):
                    pipe.lpush(scores, repr(float(score)))
                pipe.lpush(decisions, "1" if retrieved else "0")
            pipe.ltrim(scores, 0, self.window - 1)
            pipe.ltrim(decisions, 0, self.window - 1)
            pipe.incrby(self.prefix + "seen", len(entries))
            pipe.lrange(scores, 0, -1)
            pipe.lrange(decisions, 0, -1)

        got = self._run(build)
        self.seen = int(got[-3])
        return _numbers(got[-2])[::-1], [d == "1" for d in got[-1] if d in ("0", "1")][::-1]

    def read(self) -> tuple[list[float], list[bool], float | None]:
        """The window (oldest first) and tau, as the store holds them."""
        def build(pipe: Any) -> None:
            pipe.lrange(self.prefix + "scores", 0, -1)
            pipe.lrange(self.prefix + "decisions", 0, -1)
            pipe.get(self.prefix + "tau")

        got = self._run(build)
        return _numbers(got[0])[::-1], [d == "1" for d in got[1] if d in ("0", "1")][::-1], _number(got[2])

    def tau(self) -> float | None:
        return _number(self._run(lambda p: p.get(self.prefix + "tau"))[0])

    def ping(self) -> None:
        self._run(lambda p: p.ping())

    def seed(self, scores: Sequence[float], decisions: Sequence[bool]) -> bool:
        """Where the store holds no window (it restarted empty), give it this replica's (oldest first) and its
        settings; False where it holds one already (another replica seeded it, or it never lost it)."""
        keys = [self.prefix + k for k in ("meta", "scores", "decisions", "seen")]
        args = [self._settings, self.window, len(scores), *(repr(float(x)) for x in scores)]
        args += ["1" if d else "0" for d in decisions]
        got = self._run(lambda p: self._seed(keys=keys, args=args, client=p))[0]
        if int(got) < 0:
            return False
        self.seen = int(got)
        return True

    def set_tau(self, tau: float) -> None:
        """Set the fleet's tau, computed from the window as of this replica's last push, unless a replica has set
        one from a later window meanwhile."""
        keys = [self.prefix + "tau", self.prefix + "tau_seen", self.prefix + "seen"]
        self._run(lambda p: self._set_tau(keys=keys, args=[repr(float(tau)), self.seen], client=p))

    def close(self) -> None:
        self._client.close()


class Link:
    """Whether the store is reachable now, and when to try it again: a failed call marks it down (the reason is
    kept for /healthz, and logged once per outage); while down, :meth:`due` says yes at most once per
    :data:`RETRY_SECONDS`."""

    def __init__(
        self, shown: str, clock: Any = time.monotonic, *, meanwhile: str = "this replica decides alone until it is back"
    ) -> None:
        self.shown, self._clock, self.meanwhile = shown, clock, meanwhile
        self.error: str | None = None
        self._next = 0.0

    def due(self) -> bool:
        return self.error is None or self._clock() >= self._next

    def failed(self, err: StoreUnavailable) -> None:
        if self.error is None:
            log.warning("the shared state %s is unavailable (%s): %s", self.shown, err, self.meanwhile)
        self.error = f"{self.shown}: {err}"
        self._next = self._clock() + RETRY_SECONDS

    def ok(self) -> None:
        if self.error is not None:
            log.warning("the shared state %s is back", self.shown)
        self.error = None
