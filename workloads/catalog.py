"""Load the model catalog (``workloads/catalog/models/*.toml``) and inline architectures."""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from pathlib import Path
from typing import Any, Mapping

from workloads.errors import ModelCatalogError
from workloads.model import ModelSpec

MODELS_DIR = Path(__file__).parent / "catalog" / "models"
_FIELDS = {f.name: f for f in dataclasses.fields(ModelSpec)}
_REQUIRED = tuple(
    name for name, f in _FIELDS.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)


def model_from_mapping(data: Mapping[str, Any], where: str) -> ModelSpec:
    """Build a ModelSpec from TOML keys; unknown keys and wrong types raise ModelCatalogError."""
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ModelCatalogError(f"{where}: unknown keys {unknown}; allowed: {', '.join(_FIELDS)}")
    if "name" not in data:
        raise ModelCatalogError(f"{where}: missing key 'name'")
    values: dict[str, Any] = {}
    for key, value in data.items():
        expected = str(_FIELDS[key].type)
        is_int = isinstance(value, int) and not isinstance(value, bool)
        if "int" in expected and "float" not in expected and not is_int:
            raise ModelCatalogError(f"{where}: '{key}' = {value!r} must be an integer")
        if "bool" in expected and not isinstance(value, bool):
            raise ModelCatalogError(f"{where}: '{key}' = {value!r} must be true or false")
        if expected == "str" and not isinstance(value, str):
            raise ModelCatalogError(f"{where}: '{key}' = {value!r} must be a string")
        if "float" in expected:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ModelCatalogError(f"{where}: '{key}' = {value!r} must be a number")
            value = float(value)
        values[key] = value
    missing = [key for key in _REQUIRED if key not in values]
    if missing:
        raise ModelCatalogError(f"{where}: missing key{'s' if len(missing) > 1 else ''} {', '.join(repr(k) for k in missing)}")
    return ModelSpec(**values)


def load_models(directory: Path | str = MODELS_DIR) -> dict[str, ModelSpec]:
    """Every model file under ``directory``, keyed by name."""
    models: dict[str, ModelSpec] = {}
    for path in sorted(Path(directory).glob("*.toml")):
        where = f"workloads/catalog/models/{path.name}"
        try:
            with path.open("rb") as f:
                data = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ModelCatalogError(f"{where}: invalid TOML: {exc}") from None
        model = model_from_mapping(data, where)
        if model.name in models:
            raise ModelCatalogError(f"{where}: duplicate model name '{model.name}'")
        models[model.name] = model
    return models


@functools.cache
def default_models() -> Mapping[str, ModelSpec]:
    """The bundled model catalog, loaded on first use."""
    return load_models(MODELS_DIR)


def get_model(name: str) -> ModelSpec:
    """A catalog model by name; unknown names list the known ones."""
    models = default_models()
    try:
        return models[name]
    except KeyError:
        raise ModelCatalogError(f"unknown model '{name}'; known: {', '.join(sorted(models))}") from None
