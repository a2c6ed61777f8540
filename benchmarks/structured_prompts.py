"""Fifty schema-constrained prompts for benchmarks/structured_output.py: ten tasks a script asks a
coding model for (describe a function, triage a bug, a test case, a dependency, ...), each with
its JSON schema, over five inputs. Written here, not taken from Spec-Bench (whose prompts carry no
schema); `python benchmarks/structured_prompts.py > rows.jsonl` writes them as generate --prompts
rows (each with its own json_schema)."""

from __future__ import annotations

import json

FUNCTIONS = [
    "def add(a, b):\n    return a + b",
    "def read_lines(path):\n    with open(path) as f:\n        return [line.rstrip() for line in f]",
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
    "def is_prime(n):\n    if n < 2:\n        return False\n    return all(n % d for d in range(2, int(n ** 0.5) + 1))",
    "def merge(left, right):\n    out = []\n    while left and right:\n        out.append(left.pop(0) if left[0] < right[0] else right.pop(0))\n    return out + left + right",
]
BUGS = [
    "The app crashes when the user uploads an empty CSV file.",
    "Login takes 30 seconds when the password contains a unicode character.",
    "The dark mode toggle resets after every page reload.",
    "Exporting a report to PDF cuts off the last column of the table.",
    "The API returns 500 instead of 404 for a deleted user.",
]
PACKAGES = ["requests", "numpy", "pytest", "flask", "pydantic"]
LANGUAGES = ["Python", "Rust", "Go", "TypeScript", "Haskell"]
COMMANDS = ["list files sorted by size", "count lines in all .py files", "find the ten largest folders",
            "show the last 20 lines of a log and follow it", "replace foo with bar in every .txt file"]

STRING = {"type": "string"}
INTEGER = {"type": "integer"}


def obj(properties: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": properties, "required": required or list(properties),
            "additionalProperties": False}


TASKS = [
    ("Describe this Python function as JSON with its name, its parameters, what it returns and a one-line summary.\n\n{x}",
     FUNCTIONS, obj({"name": STRING, "parameters": {"type": "array", "items": STRING}, "returns": STRING,
                     "summary": STRING})),
    ("Write one unit test case for this function as JSON: the arguments and the expected result.\n\n{x}",
     FUNCTIONS, obj({"function": STRING, "arguments": {"type": "array"}, "expected": {}})),
    ("Give the time and space complexity of this function as JSON.\n\n{x}",
     FUNCTIONS, obj({"time": STRING, "space": STRING, "explanation": STRING})),
    ("Triage this bug report as JSON: severity, the component it is in, and a short title.\n\n{x}",
     BUGS, obj({"severity": {"enum": ["low", "medium", "high", "critical"]}, "component": STRING, "title": STRING})),
    ("Turn this bug report into a GitHub issue as JSON with a title, labels and steps to reproduce.\n\n{x}",
     BUGS, obj({"title": STRING, "labels": {"type": "array", "items": STRING},
                "steps": {"type": "array", "items": STRING}})),
    ("Give the Python package {x} as JSON: its name, a version number you would pin, and what it is for.",
     PACKAGES, obj({"name": STRING, "version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+(\\.[0-9]+)?$"},
                    "purpose": STRING})),
    ("Give three facts about the programming language {x} as JSON.",
     LANGUAGES, obj({"language": STRING, "year": INTEGER, "typing": {"enum": ["static", "dynamic", "gradual"]},
                     "paradigms": {"type": "array", "items": STRING}})),
    ("Write a shell command to {x}, as JSON with the command and an explanation.",
     COMMANDS, obj({"command": STRING, "explanation": STRING, "destructive": {"type": "boolean"}})),
    ("Write a hello-world program in {x} as JSON: the file name and its source code.",
     LANGUAGES, obj({"file": STRING, "source": STRING})),
    ("Suggest a name for a variable holding {x}, as JSON with three candidates and the best one.",
     ["the number of retries", "a user's email address", "a list of open sockets", "the config file path",
      "the time of the last request"],
     obj({"candidates": {"type": "array", "items": STRING, "minItems": 3, "maxItems": 3}, "best": STRING})),
]


def rows() -> list[dict]:
    return [{"id": f"{t}-{i}", "prompt": template.format(x=x), "json_schema": schema}
            for t, (template, inputs, schema) in enumerate(TASKS) for i, x in enumerate(inputs)]


if __name__ == "__main__":
    for row in rows():
        print(json.dumps(row))
