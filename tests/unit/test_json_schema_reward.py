"""json_schema: the reply's one JSON object, validated against the row's schema and matched field by field;
forgeries (duplicate keys, NaN, deep nesting, a second object, a huge reply, right names with wrong values)
do not score."""
import pytest

from lmrl.rewards import REWARD_FNS
from lmrl.rewards.structured import JsonRefused, field_score, last_object_text, parse_object
from lmrl.types import Sample

SCHEMA = {"type": "object", "required": ["name", "arguments"], "properties": {
    "name": {"enum": ["get_weather", "get_time"]},
    "arguments": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
EXPECTED = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
json_schema = REWARD_FNS.get("json_schema")


def score(text, expected=EXPECTED, **params):
    row = {"schema": SCHEMA, "answer": "", **({"expected": expected} if expected is not None else {})}
    s = Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=text, row=row)
    return json_schema(s, **params)


RIGHT = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'


def test_the_right_call_scores_one_fenced_or_bare():
    assert score(RIGHT) == 1.0
    assert score(f"Calling the tool.\n```json\n{RIGHT}\n```\nDone.") == 1.0
    assert score(RIGHT, expected=None) == 1.0


def test_fields_count_by_leaf_one_of_three_wrong_gives_two_thirds():
    # leaves: name, arguments.city, arguments.unit; the city is wrong
    assert score('{"name": "get_weather", "arguments": {"city": "Lyon", "unit": "celsius"}}') == pytest.approx(2 / 3)
    assert score('{"name": "get_weather", "arguments": {"city": "Paris"}}') == pytest.approx(2 / 3)


def test_a_schema_invalid_object_scores_zero_unless_validity_is_not_required():
    bad_unit = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}'
    assert score(bad_unit) == 0.0
    assert score(bad_unit, require_valid=False) == pytest.approx(2 / 3)
    assert score(bad_unit, expected=None) == 0.0


def test_extra_fields_allowed_or_counted_in_the_denominator():
    extra = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": 3}, "id": 1}'
    assert score(extra) == 1.0
    assert score(extra, extra_fields="penalise") == pytest.approx(3 / 5)
    with pytest.raises(ValueError, match="extra_fields must be"):
        score(RIGHT, extra_fields="ignore")


def test_duplicate_keys_are_refused_even_when_one_copy_is_right():
    assert score('{"name": "get_weather", "arguments": {"city": "Lyon", "city": "Paris", "unit": "celsius"}}') == 0
    assert score('{"name": "get_time", "name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}') == 0
    with pytest.raises(JsonRefused, match="duplicate key 'a'"):
        parse_object('{"a": 1, "a": 2}')


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(constant):
    with pytest.raises(JsonRefused, match="is not JSON"):
        parse_object(f'{{"x": {constant}}}')
    call = f'{{"name": "get_weather", "arguments": {{"city": "Paris", "unit": "celsius", "t": {constant}}}}}'
    assert score(call) == 0


def test_deep_nesting_is_refused_before_parsing():
    deep = '{"a": ' * 2000 + "1" + "}" * 2000  # 12,000 characters, under the size cap
    with pytest.raises(JsonRefused, match="nesting deeper than 20"):
        parse_object(deep)
    assert parse_object('{"a": ' * 20 + "1" + "}" * 20) is not None


def test_a_huge_reply_is_not_parsed():
    huge = RIGHT + " " * 10_000_000
    with pytest.raises(JsonRefused, match="over the 20000-character cap"):
        parse_object(huge)
    assert score(huge) == 0.0
    assert score(RIGHT + " " * 100, max_chars=len(RIGHT) + 100) == 1.0


def test_right_field_names_with_wrong_values_earn_nothing_for_those_fields():
    # the expected names everywhere, with wrong or mistyped values
    assert score('{"name": "get_time", "arguments": {"city": "city", "unit": "fahrenheit"}}') == 0.0
    assert score('{"name": "get_weather", "arguments": {"city": ["Paris"], "unit": "celsius"}}') == 0.0  # invalid
    assert field_score({"flag": 1, "n": "2"}, {"flag": True, "n": 2}, "allow") == 0.0
    assert field_score({"n": 2.0}, {"n": 2}, "allow") == 1.0
    # the expected value one level deeper is another field
    assert field_score({"arguments": {"x": {"city": "Paris"}}}, {"arguments": {"city": "Paris"}}, "allow") == 0.0


def test_only_the_last_object_counts():
    wrong_then_right = '{"name": "get_time", "arguments": {"city": "Rome"}} no, rather ' + RIGHT
    right_then_wrong = RIGHT + ' or maybe {"name": "get_time", "arguments": {"city": "Rome"}}'
    assert score(wrong_then_right) == 1.0
    assert score(right_then_wrong) == 0.0
    # a fenced block wins over bare objects around it; an invalid last object does not fall back to an earlier one
    assert score(f"```json\n{RIGHT}\n```\n" + '{"name": "get_time"}') == 1.0
    assert score(RIGHT + ' {"name": "get_weather", oops}') == 0.0


def test_braces_inside_strings_do_not_end_the_object():
    text = '{"name": "get_weather", "arguments": {"city": "Pa}ris{", "unit": "celsius"}}'
    assert last_object_text("call: " + text + " done") == text
    assert last_object_text('she said "{" then') is None
    assert score("Here { is the call: " + RIGHT) == 0.0  # an unbalanced brace in the prose leaves no object


def test_replies_without_an_object_score_zero():
    for text in ["", "get_weather(Paris)", "[1, 2]", "```json\n[1, 2]\n```", "{not json}"]:
        assert score(text) == 0.0


def test_a_bad_row_is_a_clear_error():
    s = Sample(prompt_ids=[1], completion_ids=[0], behaviour_logprobs=[0.0], text=RIGHT, row={"answer": ""})
    with pytest.raises(ValueError, match="needs a 'schema' field"):
        json_schema(s)
    s.row = {"schema": {"type": "no-such-type"}}
    with pytest.raises(ValueError, match="not a valid JSON schema"):
        json_schema(s)
    s.row = {"schema": SCHEMA, "expected": "get_weather"}
    with pytest.raises(ValueError, match="must be a non-empty JSON object"):
        json_schema(s)
