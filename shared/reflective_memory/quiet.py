"""Quiet model loading: no progress bars or library warnings unless logging asks for them.

Loading a model through transformers / sentence-transformers draws a "Loading weights" progress
bar on stderr and may log or warn about harmless details. `quiet_model_loading()` silences them
for the duration of a load, unless the `reflective_memory` logger is enabled for INFO (the CLI's
`--verbose`, or `logging.getLogger("reflective_memory").setLevel(logging.INFO)`), and restores
the libraries' own settings afterwards.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

__all__ = ["quiet_model_loading", "loading_is_verbose"]

_LOCK = threading.RLock()


def loading_is_verbose() -> bool:
    """Whether model loading may show its progress bars and warnings."""
    return logging.getLogger("reflective_memory").isEnabledFor(logging.INFO)


def _silence_transformers(stack: ExitStack) -> None:
    try:
        from transformers.utils import logging as tf_logging
    except ImportError:  # pragma: no cover - transformers is a base dependency
        return
    was_active = tf_logging.is_progress_bar_enabled()
    level = tf_logging.get_verbosity()
    tf_logging.disable_progress_bar()
    tf_logging.set_verbosity_error()

    def restore() -> None:
        tf_logging.set_verbosity(level)
        if was_active:
            tf_logging.enable_progress_bar()

    stack.callback(restore)


def _silence_hub(stack: ExitStack) -> None:
    try:
        from huggingface_hub.utils import (
            are_progress_bars_disabled,
            disable_progress_bars,
            enable_progress_bars,
        )
    except ImportError:  # pragma: no cover
        return
    if not are_progress_bars_disabled():
        disable_progress_bars()
        stack.callback(enable_progress_bars)


def _raise_loggers(stack: ExitStack, names: tuple[str, ...]) -> None:
    for name in names:
        lg = logging.getLogger(name)
        old = lg.level
        lg.setLevel(logging.ERROR)
        stack.callback(lg.setLevel, old)


@contextmanager
def quiet_model_loading(verbose: bool | None = None) -> Iterator[None]:
    """Silence progress bars, library log lines and warnings while a model loads.

    Args:
        verbose: Show them anyway; `None` decides by `loading_is_verbose()`.
    """
    if verbose is None:
        verbose = loading_is_verbose()
    if verbose:
        yield
        return
    with _LOCK, ExitStack() as stack:
        _silence_transformers(stack)
        _silence_hub(stack)
        _raise_loggers(stack, ("sentence_transformers", "transformers", "huggingface_hub"))
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        yield
