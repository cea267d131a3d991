"""Stand-in ``IPython.display``: ``HTML`` and ``display`` for sglang.utils' notebook helpers."""

from typing import Any


class HTML(str):
    """Holds the markup; nothing renders it outside a notebook."""


def display(*objs: Any, **kwargs: Any) -> None:
    print(*objs)
