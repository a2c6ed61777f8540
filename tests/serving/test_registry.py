"""The serving-engine registry: every entry's module declares itself under the same name, and --to
accepts each name and alias."""

from __future__ import annotations

import pytest

from specdec_cli.errors import UsageError
from specdec_cli.serving.export import parse_engine
from specdec_cli.serving.registry import ENGINES, REGISTRY, engine_module


@pytest.mark.parametrize("name", ENGINES)
def test_each_engine_module_declares_its_registry_name_and_a_build(name):
    module = engine_module(name)
    assert module.INFO.name == name
    assert callable(module.build)


def test_to_takes_names_aliases_and_all():
    for name, entry in REGISTRY.items():
        assert parse_engine(name.upper()) == [name]
        for alias in entry.aliases:
            assert parse_engine(alias) == [name]
    assert parse_engine("all") == list(ENGINES)
    with pytest.raises(UsageError, match="is not one of vllm, sglang"):
        parse_engine("nope")
