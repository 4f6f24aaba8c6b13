"""Structured output: the reply's JSON object, validated against the row's JSON schema and, for function
calls, compared field by field with the row's expected object.

The reply is read strictly, since the policy is optimised against this parse: one object only (the last
fenced ```json block, else the last balanced {...}), no duplicate keys, no NaN or Infinity, bounded size
and nesting. A reply that breaks a rule has no object and scores 0. The rules: docs/rewards/json_schema.md.
"""
from __future__ import annotations

import json
import re
from typing import Any

from lmrl.rewards.functions import REWARD_FNS
from lmrl.types import Sample

MAX_REPLY_CHARS = 20_000  # a longer reply is not parsed (scored 0)
MAX_DEPTH = 20  # deeper nesting of objects and arrays is refused
_FENCE = re.compile(r"```json[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


class JsonRefused(ValueError):
    """A reply whose JSON the grader does not accept (the reason is the message)."""


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise JsonRefused(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _refuse_constant(name: str) -> Any:
    raise JsonRefused(f"{name} is not JSON")


def _depth(text: str) -> int:
    """The deepest nesting of {} and [] in JSON text, strings skipped."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "}]":
            depth -= 1
    return deepest


def last_object_text(text: str) -> str | None:
    """The text of the reply's JSON object: the last fenced ```json block, else the last balanced top-level
    {...} (braces inside JSON strings ignored once an object is open), else None."""
    fenced = _FENCE.findall(text)
    if fenced:
        return fenced[-1].strip()
    last, depth, start = None, 0, 0
    in_string = escaped = False
    for i, ch in enumerate(text):
        if depth and in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif depth and ch == '"':
            in_string = True
        elif ch == "{":
            start = i if depth == 0 else start
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                last = text[start: i + 1]
    return last


def parse_object(text: str, max_chars: int = MAX_REPLY_CHARS, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """The reply's JSON object (`last_object_text`), or JsonRefused saying why there is none: the reply is
    over `max_chars`, has no object, nests deeper than `max_depth`, repeats a key, writes NaN/Infinity,
    or is not valid JSON."""
    if len(text) > max_chars:
        raise JsonRefused(f"reply of {len(text)} characters is over the {max_chars}-character cap")
    found = last_object_text(text)
    if found is None:
        raise JsonRefused("no JSON object in the reply")
    if _depth(found) > max_depth:
        raise JsonRefused(f"nesting deeper than {max_depth}")
    try:
        obj = json.loads(found, object_pairs_hook=_refuse_duplicates, parse_constant=_refuse_constant)
    except json.JSONDecodeError as err:
        raise JsonRefused(f"not valid JSON ({err.msg})") from None
    if not isinstance(obj, dict):
        raise JsonRefused(f"the fenced block holds a {type(obj).__name__}, not an object")
    return obj


def leaf_fields(obj: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Path -> value for every leaf of nested objects (a list, a scalar or an empty object is a leaf)."""
    if not isinstance(obj, dict) or not obj:
        return {prefix: obj}
    found: dict[tuple[str, ...], Any] = {}
    for key, value in obj.items():
        found.update(leaf_fields(value, prefix + (key,)))
    return found


def same_json(a: Any, b: Any) -> bool:
    """JSON equality with types kept apart: true is not 1, "1" is not 1; 1 and 1.0 are the same number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _validator(schema: Any):
    import jsonschema

    if not isinstance(schema, dict):
        raise ValueError(f"json_schema: the row's schema must be a JSON object, got {type(schema).__name__}")
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as err:
        raise ValueError(f"json_schema: the row's schema is not a valid JSON schema: {err.message}") from None
    return cls(schema)


def field_score(obj: dict[str, Any], expected: dict[str, Any], extra_fields: str) -> float:
    """The share of `expected`'s leaf fields that `obj` has with equal values (`same_json`); with
    `extra_fields="penalise"` every leaf of `obj` not in `expected` also counts in the denominator."""
    want, got = leaf_fields(expected), leaf_fields(obj)
    matched = sum(path in got and same_json(got[path], value) for path, value in want.items())
    extra = len(set(got) - set(want)) if extra_fields == "penalise" else 0
    return matched / (len(want) + extra)


@REWARD_FNS.register("json_schema", "the reply's JSON object valid against the row's schema (x the share of "
                                    "expected fields it matches)")
def json_schema_reward(sample: Sample, schema_field: str = "schema", expected_field: str = "expected",
                       require_valid: bool = True, extra_fields: str = "allow", max_chars: int = MAX_REPLY_CHARS,
                       max_depth: int = MAX_DEPTH) -> float:
    """valid x (matched expected leaf fields / expected leaf fields); valid alone when the row has no
    `expected_field`. `require_valid: false` drops the schema factor (the schema is still checked on the
    row). A reply without an acceptable object (`parse_object`) scores 0."""
    if extra_fields not in ("allow", "penalise"):
        raise ValueError(f"json_schema: extra_fields must be 'allow' or 'penalise', got {extra_fields!r}")
    row = sample.row
    if schema_field not in row:
        raise ValueError(f"json_schema needs a {schema_field!r} field in the row (set params.schema_field)")
    validator = _validator(row[schema_field])
    expected = row.get(expected_field)
    if expected is not None and (not isinstance(expected, dict) or not expected):
        raise ValueError(f"json_schema: the row's {expected_field!r} must be a non-empty JSON object")
    try:
        obj = parse_object(sample.text, max_chars, max_depth)
    except JsonRefused as err:
        sample.info["json_schema"] = f"refused: {err}"
        return 0.0
    valid = validator.is_valid(obj)
    sample.info["json_schema"] = "valid" if valid else "invalid"
    if expected is None:
        return float(valid)
    score = field_score(obj, expected, extra_fields)
    return score * valid if require_valid else score
