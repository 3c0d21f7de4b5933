"""rigel_core.strict_json.finite_or_none: the one strict-JSON helper (issue 15: it was written twice)."""
import json
import math

from rigel_core.strict_json import finite_or_none


def test_non_finite_floats_become_null_at_any_depth():
    obj = {"a": math.nan, "b": [1.5, math.inf, (-math.inf, 2)], "c": {"d": {"e": math.nan}}, "f": "nan", "g": 3,
           "h": None, "i": True}
    out = finite_or_none(obj)
    assert out == {"a": None, "b": [1.5, None, [None, 2]], "c": {"d": {"e": None}}, "f": "nan", "g": 3, "h": None,
                   "i": True}
    json.dumps(out, allow_nan=False)  # strict JSON now
    assert obj["b"][1] == math.inf  # the input is not changed


def test_finite_values_pass_unchanged():
    obj = {"x": [0.0, -1e308, 5e-324], "y": (1, 2)}
    assert finite_or_none(obj) == {"x": [0.0, -1e308, 5e-324], "y": [1, 2]}
