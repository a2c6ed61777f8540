"""Whether this Python holds what pyproject.toml asks for (its dependencies and the `dev` extra):
one line per package, and exit 1 naming what is missing or of another version. gpu_check.sh runs
it first, so that a machine with an older transformers stops in a second instead of decoding
without its KV cache for eight minutes (transformers before 5.24 ignores the `cache=` keyword).

    python benchmarks/check_requirements.py [--extra dev]
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def requirements(extras: list[str]) -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    wanted = list(project["dependencies"])
    for extra in extras:
        wanted += project["optional-dependencies"][extra]
    return [Requirement(line) for line in wanted]


def check(requirement: Requirement) -> tuple[str, bool]:
    """'name version' and whether it meets the requirement ('name missing' and False if absent)."""
    try:
        version = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        return f"{requirement.name} missing (wanted {requirement.specifier or 'any'})", False
    if not requirement.specifier.contains(version, prereleases=True):
        return f"{requirement.name} {version} (wanted {requirement.specifier})", False
    return f"{requirement.name} {version}", True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--extra", action="append", default=[], help="an optional-dependencies group to check too")
    args = parser.parse_args(argv)
    checked = [check(requirement) for requirement in requirements(args.extra)]
    print("requirements: " + ", ".join(line for line, met in checked if met))
    unmet = [line for line, met in checked if not met]
    if unmet:
        print("requirements NOT met: " + "; ".join(unmet))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
