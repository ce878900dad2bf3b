"""Time-to-live of `ReflectiveStore` items: the settings, the expiry stamps and the sweeper.

An item put with a TTL (minutes, LangGraph's unit) keeps two fields in its memory's metadata:
`ttl` (the minutes) and `expires_at` (seconds since the epoch, by the store's clock). A read
that refreshes the TTL moves `expires_at` forward with a metadata-only write
(`ReflectiveMemory.update_memory_metadata`), so nothing is re-embedded and the user's index
stays valid. `TTLSweeper` runs the store's `sweep_ttl` in a background thread.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any

from langgraph.store.base import TTLConfig
from reflective_memory.errors import ConfigError, InvalidInputError, StoreClosedError

__all__ = ["TTL_DEFAULTS", "TTLSweeper", "check_ttl", "check_ttl_config", "expiry_fields"]

logger = logging.getLogger(__name__)

#: What each `TTLConfig` key means when not given (documented in docs/langgraph_store.md):
#: no TTL, refresh on read (LangGraph's default), sweep every 5 minutes (as LangGraph's stores),
#: expired items omitted (the only choice here).
TTL_DEFAULTS: dict[str, Any] = {
    "default_ttl": None,
    "refresh_on_read": True,
    "sweep_interval_minutes": 5.0,
    "omit_expired": True,
}
_KEYS = tuple(TTL_DEFAULTS)


def _minutes(value: Any) -> bool:
    """Whether `value` is a usable number of minutes (a finite real number above 0)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def check_ttl(ttl: Any) -> float | None:
    """Check an item's TTL in minutes (None: the item never expires); return it as a float.

    Raises:
        InvalidInputError: Not None and not a finite number of minutes above 0.

    Example:
        >>> check_ttl(0.5)
        0.5
        >>> check_ttl(0)
        Traceback (most recent call last):
        ...
        reflective_memory.errors.InvalidInputError: ttl must be None or minutes > 0, got 0
    """
    if ttl is None:
        return None
    if not _minutes(ttl):
        raise InvalidInputError(f"ttl must be None or minutes > 0, got {ttl!r}")
    return float(ttl)


def check_ttl_config(config: Any) -> TTLConfig | None:
    """Check a LangGraph `TTLConfig` for `ReflectiveStore`; return a copy (or None).

    Expired items are never returned, swept or not, so `omit_expired` may only be True.

    Raises:
        ConfigError: An unknown key, or a value of the wrong type or range.
    """
    if config is None:
        return None
    if not isinstance(config, Mapping):
        raise ConfigError("ttl_config must be a dict like {'default_ttl': 60.0}")
    unknown = sorted(set(config) - set(_KEYS))
    if unknown:
        raise ConfigError(f"unknown ttl_config keys {unknown}; use {list(_KEYS)}")
    for key in ("default_ttl", "sweep_interval_minutes"):
        value = config.get(key)
        if value is not None and not _minutes(value):
            raise ConfigError(f"ttl_config[{key!r}] must be None or minutes > 0, got {value!r}")
    if not isinstance(config.get("refresh_on_read", True), bool):
        raise ConfigError("ttl_config['refresh_on_read'] must be a bool")
    if config.get("omit_expired", True) is not True:
        raise ConfigError(
            "ReflectiveStore never returns expired items; ttl_config['omit_expired'] may only "
            "be True"
        )
    return TTLConfig(**config)  # type: ignore[typeddict-item]


def expiry_fields(ttl: float, now: float) -> dict[str, float]:
    """The metadata fields of an item that expires `ttl` minutes after `now` (epoch seconds)."""
    return {"ttl": ttl, "expires_at": now + ttl * 60.0}


class TTLSweeper:
    """Runs `sweep` every interval in a daemon thread until stopped (or the store is closed).

    Args:
        sweep: Deletes the expired items and returns how many went (`ReflectiveStore.sweep_ttl`).
    """

    def __init__(self, sweep: Callable[[], int]) -> None:
        self._sweep = sweep
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        """Whether the sweeper thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, interval_minutes: float) -> concurrent.futures.Future[None]:
        """Start sweeping every `interval_minutes` (the first sweep after one interval).

        Returns:
            A future that completes when the sweeper stops; cancelling it stops the sweeper.
            When one is already running, a new future that stops it when cancelled.

        Raises:
            InvalidInputError: The interval is not a number of minutes above 0.
        """
        if not _minutes(interval_minutes):
            raise InvalidInputError(f"sweep interval must be minutes > 0, got {interval_minutes!r}")
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        future.add_done_callback(lambda f: self._stop.set() if f.cancelled() else None)
        with self._lock:
            if self.running:
                logger.info("the TTL sweeper is already running")
                return future
            self._stop.clear()
            seconds = float(interval_minutes) * 60.0
            self._thread = threading.Thread(
                target=self._loop, args=(seconds, future), daemon=True, name="ttl-sweeper"
            )
            self._thread.start()
        logger.info("TTL sweeper started: every %.3g minutes", interval_minutes)
        return future

    def _loop(self, seconds: float, future: concurrent.futures.Future[None]) -> None:
        while not self._stop.wait(seconds):
            try:
                n = self._sweep()
            except StoreClosedError:
                logger.info("the memory was closed: the TTL sweeper stops")
                break
            except Exception:  # noqa: BLE001 - one failed sweep must not end the sweeper
                logger.exception("TTL sweep failed; trying again next interval")
                continue
            if n:
                logger.info("TTL sweep deleted %d expired items", n)
        if future.set_running_or_notify_cancel():
            future.set_result(None)

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; True when it stopped (or was not running).

        Args:
            timeout: Seconds to wait for a sweep in progress to finish (`None`: as long as it
                takes).
        """
        with self._lock:
            thread = self._thread
            if thread is None or not thread.is_alive():
                return True
            self._stop.set()
        thread.join(timeout)
        stopped = not thread.is_alive()
        if stopped:
            logger.info("TTL sweeper stopped")
        else:
            logger.warning("the TTL sweeper did not stop within %s seconds", timeout)
        return stopped
