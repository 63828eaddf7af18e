"""Every wire model and type adapter builds (ADR 0141).

Models build their validators at first use, so a broken annotation or a validator
naming a missing field would otherwise surface only when a user's request reaches
that model. These tests build each one, and check the import itself stays cheap.
"""

import importlib
import pkgutil

import pydantic
import pytest

import gpulayer.contracts as c
import gpulayer.worker.channel as channel

from ..support import fresh_interpreter


def _contract_modules() -> list[object]:
    names = [m.name for m in pkgutil.iter_modules(c.__path__, prefix="gpulayer.contracts.")]
    return [importlib.import_module(name) for name in names]


def _models() -> list[type[pydantic.BaseModel]]:
    found: dict[str, type[pydantic.BaseModel]] = {}
    for module in [c, *_contract_modules()]:
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, pydantic.BaseModel)
                and value.__module__.startswith("gpulayer.contracts")
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[k] for k in sorted(found)]


def _adapters() -> list[tuple[str, pydantic.TypeAdapter[object]]]:
    found = []
    for module in [*_contract_modules(), channel]:
        for name, value in vars(module).items():
            if isinstance(value, pydantic.TypeAdapter):
                found.append((f"{module.__name__}.{name}", value))  # type: ignore[attr-defined]
    return found


def test_there_are_models_and_adapters_to_check() -> None:
    assert len(_models()) > 50
    assert {name.rsplit(".", 1)[1] for name, _ in _adapters()} >= {"_ADAPTER", "_NAME", "_Incoming"}


@pytest.mark.parametrize("model", _models(), ids=lambda m: m.__qualname__)
def test_each_model_builds_and_gives_a_schema(model: type[pydantic.BaseModel]) -> None:
    model.model_rebuild(force=True)
    assert model.__pydantic_complete__
    assert model.model_json_schema(mode="validation")["type"] == "object"


@pytest.mark.parametrize("entry", _adapters(), ids=lambda e: e[0])
def test_each_adapter_builds(entry: tuple[str, pydantic.TypeAdapter[object]]) -> None:
    _, adapter = entry
    assert adapter.json_schema()


def test_importing_the_contracts_builds_no_model() -> None:
    probe = (
        "import gpulayer.contracts as c, pydantic\n"
        "built = sorted(n for n in c.__all__ if isinstance(getattr(c, n), type)"
        " and issubclass(getattr(c, n), pydantic.BaseModel)"
        " and getattr(c, n).__pydantic_complete__)\n"
        "print(json.dumps(built))\n"
    )
    built, _ = fresh_interpreter("import json\n" + probe)
    assert built == [], f"built at import: {built}"


def test_a_deferred_model_still_rejects_bad_input_with_the_field_named() -> None:
    with pytest.raises(pydantic.ValidationError) as e:
        c.JobSpec.model_validate({"name": "x", "command": ["true"], "resources": {"gpus": -1}})
    assert e.value.errors()[0]["loc"] == ("resources", "gpus")
    assert c.JobSpec.model_validate({"name": "x", "command": ["true"]}).resources.cpus == 1.0
