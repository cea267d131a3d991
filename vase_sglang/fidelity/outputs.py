"""What a measurement folder keeps and what its command rewrites: the summary beside the raw dump.

A tool writes ``NAME.json``, the summary the docs quote and the server reads (small enough
to commit), and ``NAME.raw.json`` beside it: the per-request, per-token or per-round data
the summary was computed from, which a rerun of the command writes again (``.gitignore``
keeps it out of ``results/``). ``RAW_PATHS`` name the raw parts by key path, ``*`` for
every key at that level. ``read_json`` puts the two back together, so a tool resumes from
both (or, without the raw file, from the summary alone).

Plots go through ``save_png``: the figure as matplotlib draws it, then stored as a
palette PNG (256 colours, no dithering), about a third of matplotlib's RGBA file for the
same picture.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RawPaths = Sequence[tuple[str, ...]]


def raw_path(path: Path) -> Path:
    """``NAME.json`` -> ``NAME.raw.json`` beside it."""
    return path.with_name(path.stem + ".raw.json")


def write_json(path: Path, data: dict, indent: int | None = 1) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=indent) + "\n")
    tmp.rename(path)


def _move(src: dict, dst: dict, path: tuple[str, ...]) -> None:
    head, rest = path[0], path[1:]
    for key in (list(src) if head == "*" else [head] if head in src else []):
        if not rest:
            dst[key] = src.pop(key)
        elif isinstance(src[key], dict):
            src[key] = dict(src[key])  # a copy: the caller's dict stays whole
            part = dst.setdefault(key, {})
            _move(src[key], part, rest)
            if not part:
                del dst[key]


def split_raw(data: dict, paths: RawPaths) -> tuple[dict, dict]:
    """``data`` without the parts at ``paths`` (its other keys in their order), and those parts
    alone, nested as they were."""
    summary: dict = dict(data)
    raw: dict = {}
    for path in paths:
        _move(summary, raw, path)
    return summary, raw


def merge_raw(summary: dict, raw: dict) -> dict:
    """The inverse of ``split_raw``: ``summary`` with the raw parts put back."""
    out = dict(summary)
    for key, value in raw.items():
        out[key] = merge_raw(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def write_split(path: Path, data: dict, paths: RawPaths, indent: int | None = 1) -> None:
    """``path`` gets the summary (``indent`` as given), ``raw_path(path)`` the raw parts (compact)."""
    summary, raw = split_raw(data, paths)
    if raw:
        write_json(raw_path(path), raw, indent=None)
    write_json(path, summary, indent=indent)


def read_json(path: Path) -> dict[str, Any]:
    """``path`` merged with its raw file when there is one; ``{}`` without ``path``."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    raw = raw_path(path)
    return merge_raw(data, json.loads(raw.read_text())) if raw.is_file() else data


def compact_png(png: bytes) -> bytes:
    """A PNG as a 256-colour palette image (no dithering), optimised: the file ``save_png`` writes."""
    from PIL import Image

    out = io.BytesIO()
    image = Image.open(io.BytesIO(png)).convert("RGB")
    image.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(out, format="PNG",
                                                                                         optimize=True)
    return out.getvalue()


def save_png(fig: Any, path: Path, **savefig: Any) -> None:
    """``fig.savefig(path, **savefig)``, stored by ``compact_png``."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **savefig)
    path.write_bytes(compact_png(buf.getvalue()))
