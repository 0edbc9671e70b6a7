"""``[api]`` and ``[health]``: the HTTP API of ``dblog run`` / ``dblog sync`` and the
thresholds of ``GET /health``.

Invariants (checked at load, see ``ApiConfig._safe``): the API never listens beyond
loopback without a ``token``; the token never appears in ``repr``, logs or errors.
"""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def split_listen(listen: str) -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:8083"`` for IPv6) as ``(host, port)``; raises
    ``ValueError`` naming the problem."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{listen!r} is not host:port (e.g. \"127.0.0.1:8083\")")
    host = host.removeprefix("[").removesuffix("]")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"{listen!r}: the port {port!r} is not a number") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"{listen!r}: the port must be 0..65535 (0 picks a free one)")
    return host, number


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ApiConfig(_Model):
    """``listen``: where ``dblog run`` serves the API (``""`` turns it off; port 0
    picks a free port, written to ``api.json`` in the log directory);
    ``sync_listen``: the same for ``dblog sync`` (``/health``, ``/metrics``);
    ``token``: required (``Authorization: Bearer TOKEN``) for requests that change
    state and for ``/events`` (row data); mandatory when listening beyond loopback."""

    listen: str = "127.0.0.1:8083"
    sync_listen: str = "127.0.0.1:8084"
    token: str | None = Field(default=None, min_length=16, repr=False)

    @model_validator(mode="after")
    def _safe(self) -> ApiConfig:
        for name in ("listen", "sync_listen"):
            value = getattr(self, name)
            if not value:
                continue
            host, _ = split_listen(value)
            if not is_loopback(host) and self.token is None:
                raise ValueError(
                    f"api.{name} = {value!r} is beyond loopback and no api.token is set: "
                    "set a token (at least 16 characters) or listen on 127.0.0.1"
                )
        return self


class HealthConfig(_Model):
    """Thresholds of ``GET /health`` (see docs/operations.md).

    ``max_idle_minutes``: no event logged for this long is unhealthy *only* when the
    source has changed meanwhile (DBLog's rule: a quiet database is fine);
    ``max_slot_lag_bytes``: source log retained for us beyond this is unhealthy (None:
    no limit); ``snapshot_stuck_minutes``: a running, unpaused snapshot whose progress
    did not move for this long is unhealthy; ``probe_interval_s``: how often the API
    asks the source (reachable, slot lag, changed?)."""

    max_idle_minutes: float = Field(default=30.0, gt=0)
    max_slot_lag_bytes: int | None = Field(default=1 << 30, gt=0)
    snapshot_stuck_minutes: float = Field(default=10.0, gt=0)
    probe_interval_s: float = Field(default=5.0, gt=0)
