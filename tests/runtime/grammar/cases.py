"""Constraint cases for the structured-output tests: JSON schemas (with the task that asks for them) and regexes.
Strings, arrays and numbers are bounded so that every case completes within the tests' token budget."""
from __future__ import annotations

NAME = {"type": "string", "minLength": 1, "maxLength": 16}
SHORT = {"type": "string", "maxLength": 24}


def obj(props: dict, required: list[str] | None = None, **extra) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required, **extra}


SCHEMAS: list[tuple[str, dict]] = [
    ("a person named Alice aged 30", obj({"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("a city and its country", obj({"city": NAME, "country": NAME})),
    ("a boolean flag saying whether water is wet", obj({"wet": {"type": "boolean"}})),
    ("a traffic light color", obj({"color": {"enum": ["red", "yellow", "green"]}})),
    ("a product with a price between 1 and 100", obj({"product": NAME, "price": {"type": "number", "minimum": 1, "maximum": 100}})),
    ("three fruits", obj({"fruits": {"type": "array", "items": NAME, "minItems": 3, "maxItems": 3}})),
    ("up to two hobbies", obj({"hobbies": {"type": "array", "items": NAME, "maxItems": 2}})),
    ("a point with x and y between -10 and 10", obj({"x": {"type": "integer", "minimum": -10, "maximum": 10},
                                                       "y": {"type": "integer", "minimum": -10, "maximum": 10}})),
    ("a book with a title and an author object", obj({"title": SHORT, "author": obj({"first": NAME, "last": NAME})})),
    ("a date in ISO format", obj({"date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}})),
    ("a US zip code", obj({"zip": {"type": "string", "pattern": r"^[0-9]{5}$"}})),
    ("a user with an optional nickname", obj({"user": NAME, "nickname": NAME}, required=["user"])),
    ("a planet and whether it has rings", obj({"planet": {"enum": ["Mercury", "Venus", "Earth", "Mars", "Jupiter", "Saturn"]},
                                               "rings": {"type": "boolean"}})),
    ("a rating from 1 to 5 stars", obj({"stars": {"type": "integer", "minimum": 1, "maximum": 5}})),
    ("a temperature in Celsius", obj({"celsius": {"type": "number", "minimum": -50, "maximum": 60}})),
    ("an RGB color", obj({"r": {"type": "integer", "minimum": 0, "maximum": 255}, "g": {"type": "integer", "minimum": 0, "maximum": 255},
                          "b": {"type": "integer", "minimum": 0, "maximum": 255}})),
    ("a list of two coordinates", obj({"points": {"type": "array", "minItems": 2, "maxItems": 2,
                                                  "items": obj({"lat": {"type": "integer", "minimum": -90, "maximum": 90},
                                                                "lon": {"type": "integer", "minimum": -180, "maximum": 180}})}})),
    ("an email address", obj({"email": {"type": "string", "pattern": r"^[a-z]{1,8}@[a-z]{1,8}\.com$"}})),
    ("a yes or no answer to: is the sun a star?", obj({"answer": {"enum": ["yes", "no"]}})),
    ("a movie with a year between 1950 and 2024", obj({"movie": SHORT, "year": {"type": "integer", "minimum": 1950, "maximum": 2024}})),
    ("a company with an address", obj({"company": NAME, "address": obj({"street": SHORT, "city": NAME,
                                                                          "zip": {"type": "string", "pattern": r"^\d{5}$"}})})),
    ("an animal and its number of legs", obj({"animal": NAME, "legs": {"type": "integer", "enum": [0, 2, 4, 6, 8]}})),
    ("a weekday", obj({"day": {"enum": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]}})),
    ("a constant version field", obj({"version": {"const": "1.0"}, "name": NAME})),
    ("a recipe with up to three ingredients", obj({"dish": NAME, "ingredients": {"type": "array", "items": NAME,
                                                                                  "minItems": 1, "maxItems": 3}})),
    ("an employee with an id and a department", obj({"id": {"type": "integer", "minimum": 1, "maximum": 9999},
                                                     "department": {"enum": ["sales", "engineering", "support"]}})),
    ("a time of day as hours and minutes", obj({"hour": {"type": "integer", "minimum": 0, "maximum": 23},
                                                "minute": {"type": "integer", "minimum": 0, "maximum": 59}})),
    ("a pair of numbers that are either integers or null", obj({"a": {"type": ["integer", "null"], "minimum": 0, "maximum": 99},
                                                                "b": {"type": ["integer", "null"], "minimum": 0, "maximum": 99}})),
    ("a team with a captain and two members", obj({"captain": NAME, "members": {"type": "array", "items": NAME,
                                                                                "minItems": 2, "maxItems": 2}})),
    ("a sentiment label for 'I love this'", obj({"label": {"enum": ["positive", "negative", "neutral"]},
                                                 "confidence": {"type": "number", "minimum": 0, "maximum": 1}})),
    ("a nested config with a debug flag and a level", obj({"config": obj({"debug": {"type": "boolean"},
                                                                         "level": {"enum": ["low", "high"]}})})),
    ("a country code of two capital letters", obj({"code": {"type": "string", "pattern": r"^[A-Z]{2}$"}})),
]

REGEXES: list[tuple[str, str]] = [
    ("The phone number is ", r"\(\d{3}\) \d{3}-\d{4}"),
    ("Today's date: ", r"\d{4}-\d{2}-\d{2}"),
    ("The answer (yes or no): ", r"(yes|no)"),
    ("An IPv4 address: ", r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"),
    ("A hex color: ", r"#[0-9a-f]{6}"),
    ("Name: Alice. Age: ", r"[1-9][0-9]?"),
    ("The capital of France is ", r"[A-Z][a-z]{1,10}\."),
    ("Email: ", r"[a-z]{1,10}@example\.com"),
    ("Grade: ", r"[A-F][+-]?"),
    ("A time: ", r"([01]\d|2[0-3]):[0-5]\d"),
    ('A JSON pair: ', r'\{"key": "[a-z]{1,8}"\}'),
    ("Version: ", r"v\d\.\d\.\d"),
]

EBNF = """
root ::= "The " animal " says " sound "."
animal ::= "cat" | "dog" | "cow"
sound ::= "meow" | "woof" | "moo"
"""
