"""Stand-in ``soundfile``: imported by SGLang's audio endpoints, which a text model never serves."""

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(f"soundfile.{name}: audio is not available in the GPU end-to-end kit")
