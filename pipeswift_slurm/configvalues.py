"""train.toml's values checked one by one (config.py's sections use them): each wrong type or
out-of-range value raises ConfigError naming ``[section] key``, the value and the fix."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path
from typing import Any

from pipeswift_slurm.errors import ConfigError
from pipeswift_slurm.numeric import finite
from pipeswift_slurm.settings import LIMITS

#: a model entry point, 'module:function'
ENTRY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def where(section: str, key: str) -> str:
    return f"[{section}] {key}"


def type_name(v: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(v), type(v).__name__)


def int_value(section: str, key: str, v: Any, lo: int = 1, hi: int = LIMITS["int"]) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{where(section, key)} must be an integer, got {type_name(v)} {short(v)}")
    if v < lo:
        raise ConfigError(f"{where(section, key)} = {short(v)} must be >= {lo}")
    if v > hi:
        raise ConfigError(f"{where(section, key)} = {short(v)} is larger than pswift supports "
                          f"({hi}); use a smaller value")
    return v


def short(v: Any) -> str:
    text = repr(v) if not isinstance(v, int) or abs(v) < 10**30 else f"<{len(str(abs(v)))}-digit integer>"
    return text if len(text) <= 80 else text[:77] + "..."


def json_value(where: str, v: Any, depth: int = 0) -> None:
    """Tables passed on to Python code and DeepSpeed (kwargs, ds_config, optimizer params) must
    be JSON-like: no dates or times, finite numbers, int64 integers, bounded nesting."""
    if depth > LIMITS["depth"]:
        raise ConfigError(f"{where} is nested deeper than {LIMITS['depth']} levels; flatten it")
    if isinstance(v, dict):
        for k, x in v.items():
            json_value(f"{where}.{k}", x, depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            json_value(f"{where}[{i}]", x, depth + 1)
    elif isinstance(v, bool) or isinstance(v, str) or v is None:
        return
    elif isinstance(v, int):
        if not -2**63 <= v < 2**63:
            raise ConfigError(f"{where} = {short(v)} does not fit in 64 bits; use a smaller number")
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise ConfigError(f"{where} = {v} is not a finite number; use a finite value")
    else:
        raise ConfigError(f"{where} = {short(v)} is a TOML {type_name(v)}, which cannot be passed "
                          f"on; write it as a string")


def str_value(section: str, key: str, v: Any) -> str:
    if not isinstance(v, str):
        raise ConfigError(f"{where(section, key)} must be a string, got {type_name(v)} {v!r}")
    if not v.strip():
        raise ConfigError(f"{where(section, key)} must not be empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ConfigError(f"{where(section, key)} = {v!r} contains a control character "
                          f"(newline, tab...): remove it")
    return v


def float_value(section: str, key: str, v: Any, lo: float = 0.0) -> float:
    f = finite(v)
    if f is None:
        shown = (f"an integer of {len(str(abs(v)))} digits, too large for a float" if isinstance(v, int)
                 and not isinstance(v, bool) else f"{type_name(v)} {v!r}")
        raise ConfigError(f"{where(section, key)} must be a finite number, got {shown}")
    if f < lo:
        raise ConfigError(f"{where(section, key)} = {v} must be >= {lo}")
    return f


def table(section: str, key: str, v: Any) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ConfigError(f"{where(section, key)} must be a table, got {type_name(v)} {short(v)}")
    json_value(where(section, key), v)
    return v


def entry(section: str, key: str, raw: Any, base_dir: Path) -> str:
    v = str_value(section, key, raw)
    if not ENTRY_RE.match(v):
        raise ConfigError(f"{where(section, key)} = {v!r} must look like 'module:function' "
                          f"(e.g. 'model:build_layers')")
    module = v.split(":")[0]
    top = module.split(".")[0]
    rel = Path(*module.split("."))
    if not ((base_dir / f"{rel}.py").is_file() or (base_dir / rel / "__init__.py").is_file()
            or (base_dir / top).is_dir() or importlib.util.find_spec(top) is not None):
        raise ConfigError(f"{where(section, key)} = {v!r}: module {module!r} not found next to "
                          f"{base_dir} nor on the Python path: create {base_dir / rel}.py or fix the name")
    return v


def choice(section: str, key: str, v: Any, choices: tuple[Any, ...]) -> Any:
    if not any(type(v) is type(c) and v == c for c in choices):
        shown = [repr(c) if isinstance(c, str) else str(c) for c in choices]
        what = " or ".join(shown) if len(shown) == 2 else "one of " + ", ".join(shown)
        raise ConfigError(f"{where(section, key)} = {short(v)} must be {what}")
    return v


def int_or_auto(section: str, key: str, v: Any, lo: int = 1) -> int | str:
    if v == "auto":
        return "auto"
    if isinstance(v, str):
        what = "a positive integer" if lo == 1 else f"an integer >= {lo}"
        raise ConfigError(f"{where(section, key)} = {short(v)} must be {what} or \"auto\"")
    return int_value(section, key, v, lo=lo)
