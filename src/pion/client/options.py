"""redis-py's options for the clients' connections, shared by the sync and asyncio
clients (and importable from :mod:`pion.client.base`, where they were first defined)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["connection_options", "tls_options"]

# No CLIENT SETINFO on connect: two round trips saved per connection.
_NO_SETINFO: dict[str, Any]
try:
    from redis.driver_info import DriverInfo

    _NO_SETINFO = {"driver_info": DriverInfo(name=None, lib_version=None)}
except ImportError:  # redis-py before 7.1 has no DriverInfo
    _NO_SETINFO = {"lib_name": None, "lib_version": None}


def connection_options(
    password: str | None,
    username: str | None,
    timeout: float,
    extra: Mapping[str, Any] | None,
    *,
    retry: object = None,
) -> dict[str, Any]:
    """redis-py options shared by the sync and asyncio clients. ``retry``: the
    no-retry policy to use (redis.asyncio takes its own ``Retry`` class; default the
    sync one); a ``retry`` in ``extra`` wins, as every other option there does."""
    return {
        "password": password,
        "username": username,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "protocol": 2,
        **_NO_SETINFO,
        # redis-py retries ConnectionError 10 times with backoff by default, and it
        # classes NOAUTH/WRONGPASS/LOADING replies as ConnectionErrors: such a reply
        # would take seconds to surface. A dead pooled socket is still replaced on
        # checkout, so no retry is needed for that.
        "retry": Retry(NoBackoff(), 0) if retry is None else retry,
        **(extra or {}),
    }


def tls_options(ssl: bool | Mapping[str, Any]) -> dict[str, Any]:
    """redis-py's options for the client's ``ssl`` argument: ``{}`` for False,
    ``ssl=True`` plus each ``key`` of a mapping as ``ssl_<key>``."""
    if ssl is False:
        return {}
    if ssl is True:
        return {"ssl": True}
    return {"ssl": True, **{f"ssl_{key}": value for key, value in ssl.items()}}
