"""The config's JSON Schema (aibrix_eic/config/json_schema.py): the shipped
files are what the key declarations generate, and the schema and the
validator agree on the example configs, on every key's values at and past
its bounds, and on bad configs, apart from the differences the module
names (quoted numbers, whole floats, size strings' bounds, rules across keys)."""

import json
import os
import tempfile
from pathlib import Path

import jsonschema
import pytest
import yaml

from aibrix_eic.config import BOUNDS, KEY_CHECKS, ConfigError, EICConfig
from aibrix_eic.config import schema as checks
from aibrix_eic.config.json_schema import SCHEMA_FILE, json_schema, schema_text

REPO = Path(__file__).resolve().parents[2]
VALIDATOR = jsonschema.Draft202012Validator(json_schema())


def schema_accepts(data: object) -> bool:
    return VALIDATOR.is_valid(data)


def validator_accepts(data: dict) -> bool:
    """What `check --config-only` says of the file holding data."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(data, f)
        f.flush()
        try:
            EICConfig.load(f.name, node_checks=False)
        except ConfigError:
            return False
    return True


def example_configs() -> list[tuple[str, dict]]:
    found = []
    for path in sorted((REPO / "deploy").rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and "remote_url" in document:
                found.append((str(path.relative_to(REPO)), document))
            elif isinstance(document, dict) and document.get("kind") == "ConfigMap":
                for name, text in (document.get("data") or {}).items():
                    if name.endswith((".yaml", ".yml")) and "remote_url" in text:
                        found.append((f"{path.relative_to(REPO)}:{name}", yaml.safe_load(text)))
    return found


def test_the_shipped_schema_files_are_current():
    """Regenerate with: python -m aibrix_eic.config.json_schema > FILE (both)."""
    text = schema_text()
    for path in (SCHEMA_FILE, REPO / "docs" / "eic-config.schema.json"):
        assert path.read_text() == text, f"{path} is stale: regenerate it"


def test_the_schema_is_a_valid_draft_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(json.loads(SCHEMA_FILE.read_text()))


def test_every_key_is_in_the_schema_with_its_default():
    properties = json_schema()["properties"]
    assert set(properties) == set(KEY_CHECKS)
    for key, spec in properties.items():
        assert VALIDATOR.evolve(schema=spec).is_valid(spec["default"]), key


EXAMPLES = example_configs()


def test_the_examples_were_found():
    names = {name for name, _ in EXAMPLES}
    assert {"deploy/eic.yaml", "deploy/eic-local.yaml", "deploy/vllm-aibrix-eic.k8s.yaml:eic.yaml"} <= names


@pytest.mark.parametrize("name, data", EXAMPLES, ids=[name for name, _ in EXAMPLES])
def test_the_schema_and_the_validator_accept_every_example_config(name, data):
    assert validator_accepts(data), name
    errors = [error.message for error in VALIDATOR.iter_errors(data)]
    assert not errors, f"{name}: {errors}"


def candidates(key: str) -> list[object]:
    """Values to try for a key: its bounds and just past them, and values
    of other types."""
    values: list[object] = [None, True, "text", 1.5, 0, -1, 7, [1], {"a": 1}]
    bounds = BOUNDS.get(key)
    if bounds is not None:
        low, high = bounds.low, bounds.high
        step = 1 if isinstance(low, int) and isinstance(high, int) else 0.0005
        values += [low, high, low - step, high + step]
        if bounds.size:
            values += ["4MiB", "1KiB", "four"]
    check = KEY_CHECKS[key]
    if check is checks.put_mode:
        values += list(checks.PUT_MODES) + ["fast"]
    if check is checks.transport_type:
        values += [0, 1, 2, 3, 4]
    if check is checks.listen_address:
        values += ["0.0.0.0", "::1", "metrics.local", "bad host!"]
    if check is checks.model_name:
        values += ["llama3-70b", "", "x" * 300]
    return values


# Rules across keys the schema cannot state (json_schema.py's docstring).
ACROSS_KEYS = {"retry_backoff_max_ms", "retry_backoff_ms", "block_nbytes"}


@pytest.mark.parametrize("key", sorted(set(KEY_CHECKS) - {"remote_url"} - ACROSS_KEYS))
def test_the_schema_and_the_validator_agree_on_each_keys_values(key):
    disagree = []
    for value in candidates(key):
        data = {"remote_url": "local://", key: value}
        if validator_accepts(data) != schema_accepts(data):
            disagree.append((value, validator_accepts(data)))
    assert not disagree, f"{key}: (value, validator's verdict) where the schema differs: {disagree}"


@pytest.mark.parametrize(
    "data",
    [
        {"eic_thread_num": 6},  # no remote_url
        {"remote_url": "redis://x"},
        {"remote_url": "eic://10.0.0.1:12500"},  # no eic_instance_id
        {"remote_url": "eic://10.0.0.1:12500", "eic_instance_id": ""},
        {"remote_url": "local://", "eic_kv_ttl": 0},
        {"remote_url": "local://", "eic_namespace": "x"},  # SGLang's key
        {"remote_url": "local://", "fail_open": "maybe"},
        {"remote_url": "local://", "batch_bytes": "lots"},
    ],
)
def test_a_bad_config_is_refused_by_both(data):
    assert not validator_accepts(data)
    assert not schema_accepts(data)


def test_an_across_key_rule_is_the_connectors_alone():
    """The documented difference, so that a change closing it is noticed."""
    data = {"remote_url": "local://", "retry_backoff_ms": 10, "retry_backoff_max_ms": 5}
    assert not validator_accepts(data) and schema_accepts(data)


def test_the_docs_copy_is_the_one_the_config_page_names():
    assert "eic-config.schema.json" in (REPO / "docs" / "config.md").read_text()
    assert os.path.isfile(REPO / "docs" / "eic-config.schema.json")


def test_the_config_page_lists_every_keys_variable_as_generated():
    from aibrix_eic.config.json_schema import env_table

    text = (REPO / "docs" / "config.md").read_text()
    listed = text.split("<!-- env-keys:start -->\n", 1)[1].split("<!-- env-keys:end -->", 1)[0]
    assert listed == env_table(), "regenerate with: python -m aibrix_eic.config.json_schema --env-table"
