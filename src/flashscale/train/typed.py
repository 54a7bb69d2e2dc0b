"""Values of annotated types from TOML (already typed) and from command-line strings: the checks and
conversions behind the training config. Supports bool, int, float, str, Literal, list[X],
tuple[X, ...], dict and unions with None; anything else is a bug in the annotation, not user input.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from typing import Any, Literal, Union

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        names = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or none" if type(None) in args else "")
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is tuple:
        return f"list of {len(args)} {type_name(args[0])}"
    if origin is dict or tp is dict:
        return "table"
    return getattr(tp, "__name__", str(tp))


class Mismatch(Exception):
    """The value does not fit the annotation (the caller words the error: it knows the key)."""


def coerce(value: Any, tp: Any) -> Any:
    """`value` (as TOML or JSON gives it) checked against annotation `tp`; raises Mismatch."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg)
            except Mismatch:
                pass
        raise Mismatch
    if origin is Literal:
        if value in args and type(value) is type(args[0]):
            return value
        raise Mismatch
    if origin is list:
        if not isinstance(value, list):
            raise Mismatch
        return [coerce(v, args[0]) for v in value]
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise Mismatch
        return tuple(coerce(v, a) for v, a in zip(value, args))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise Mismatch
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise Mismatch
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        raise Mismatch
    raise TypeError(f"config annotation {tp!r} is not supported")  # a bug in this file, not user input


_TRUE, _FALSE, _NONE = ("true", "yes", "on", "1"), ("false", "no", "off", "0"), ("none", "null")


def parse_text(text: str, tp: Any) -> Any:
    """A command-line string read as the type `tp` wants; raises Mismatch."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if text.strip().lower() in _NONE and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return parse_text(text, arg)
            except Mismatch:
                pass
        raise Mismatch
    if origin is Literal:
        return coerce(text, tp)
    if origin in (list, tuple):
        s = text.strip()
        if s.startswith("["):  # TOML/JSON array syntax: [0.9, 0.95] or ["a.txt", "b.txt"]
            try:
                return coerce(tomllib.loads(f"v = {s}")["v"], tp)
            except tomllib.TOMLDecodeError as e:
                raise Mismatch from e
        items = [p.strip() for p in s.split(",")] if s else []
        item_types = args if origin is tuple else [args[0]] * len(items)
        if origin is tuple and len(items) != len(args):
            raise Mismatch
        return coerce([parse_text(p, t) for p, t in zip(items, item_types)], tp)
    if origin is dict or tp is dict:
        try:
            return coerce(json.loads(text), tp)
        except json.JSONDecodeError:
            try:
                return coerce(tomllib.loads(f"v = {text}")["v"], tp)
            except tomllib.TOMLDecodeError as e:
                raise Mismatch from e
    if tp is bool:
        low = text.strip().lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise Mismatch
    if tp is int:
        try:
            return int(text.replace("_", ""))
        except ValueError as e:
            raise Mismatch from e
    if tp is float:
        try:
            return float(text)
        except ValueError as e:
            raise Mismatch from e
    if tp is str:
        return text
    raise TypeError(f"config annotation {tp!r} is not supported")
