"""The one reader of TOML/JSON table files (spec files, design files)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path


def read_table_file(path: str | Path, what: str):
    """The parsed content of a .toml or .json file.

    Args:
        path: the file.
        what: how messages name it, e.g. "spec file".

    Raises:
        ValueError: a missing file, another extension, or malformed content; the message
            names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what} {path} does not exist")
    try:
        text = path.read_text()
        if path.suffix.lower() == ".toml":
            return tomllib.loads(text)
        if path.suffix.lower() == ".json":
            return json.loads(text)
        raise ValueError(f"{what} {path} must end in .toml or .json")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} {path} is malformed: {e}") from None
