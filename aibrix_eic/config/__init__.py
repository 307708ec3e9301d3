"""Load and validate the connector's YAML config; nothing else reads files.

Every key of the upstream AIBrix EIC YAML is accepted unchanged, so an
existing file works as is. Each key is declared once, as an EICConfig field
with its default, its check and its bounds (schema.py); docs/config.md
documents every one.
A file is checked whole: every problem found (yaml_file.py reads the file
and its lines) goes into one ConfigError, each naming the file, the line,
the key, what was expected and a fix.

Hand-written rather than pydantic (which aibrix-kvcache installs): its lax
mode reads `eic_thread_num: true` as 1 and `fail_open: 1` as true, and its
messages name neither the value nor a fix, so each check and message would
be overridden and pydantic would only collect the errors.
"""

import dataclasses
import difflib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..util.docs import docs_url
from . import schema
from .schema import Bounds, ConfigError, GiB, Problem, config_key, sizes
from .yaml_file import ConfigFile

logger = logging.getLogger(__name__)

ENV_CONFIG = "AIBRIX_KV_CACHE_OL_EIC_CONFIG"
ENV_CONFIG_UPSTREAM = "AIBRIX_KV_CACHE_OL_EIC_CONFIG_FILE"
DEFAULT_SOURCE = "<defaults>"
ENV_SOURCE = "<environment>"  # no file, but AIBRIX_EIC_<KEY> variables
SCHEMES = ("eic", "local")
MiB = 1024**2
_MS = Bounds(0.001, 3_600_000)  # a deadline or an age, in ms: up to an hour

# Keys other EIC callers use: why they are not ours, and ours to use instead.
_FOREIGN_KEYS: dict[str, tuple[str, str | None]] = {
    "eic_namespace": ("SGLang's name for the namespace", "eic_kv_ns"),
    "eic_refetch_shard_size": ("an SGLang fork key", "batch_keys"),
    "eic_check_max_num": ("an SGLang fork key with no equivalent here", None),
    "enable_kvset_direct": ("an SGLang key", "put_registered"),
    "enable_kvget_direct": ("an SGLang key; reads always use registered memory when it is registered", None),
    "enable_kvset_gpu_direct": ("an SGLang key; GDR puts are not supported yet", None),
    "enable_kvget_gpu_direct": ("an SGLang key; GDR gets are not supported yet", None),
}


@dataclass(frozen=True)
class EICConfig:
    """Validated settings; build with EICConfig.load or EICConfig.from_env."""

    source: str = DEFAULT_SOURCE  # not a key: the file the values came from
    lines: Mapping[str, int] = dataclasses.field(default_factory=dict, compare=False, repr=False)  # not a key: of each
    # not a key: the AIBRIX_EIC_<KEY> variables that overrode the file
    overridden_by: tuple[str, ...] = dataclasses.field(default=(), compare=False)
    # Upstream keys (aibrix_kvcache/l2/connectors/eic/eic.py), same defaults.
    remote_url: str = config_key("local://", schema.string)
    eic_instance_id: str = config_key("", schema.string)
    eic_thread_num: int = config_key(6, schema.integer, Bounds(1, 1024))
    eic_log_dir: str | None = config_key(None, schema.optional_string)
    eic_log_level: int = config_key(1, schema.log_level)
    eic_trans_type: int = config_key(3, schema.transport_type)
    eic_kv_ttl: int = config_key(-1, schema.integer, Bounds(-1, 2**31 - 1))
    eic_kv_ns: str = config_key("", schema.string)
    eic_flag_file: str | None = config_key(None, schema.optional_string)
    # Our keys.
    batch_keys: int = config_key(64, schema.integer, Bounds(1, 65536))
    batch_bytes: int = config_key(16 * MiB, schema.size, sizes(1, 64 * GiB))
    get_timeout_ms: float = config_key(2000.0, schema.positive_number, _MS)
    put_timeout_ms: float = config_key(5000.0, schema.positive_number, _MS)
    exists_timeout_ms: float = config_key(500.0, schema.positive_number, _MS)
    delete_timeout_ms: float = config_key(2000.0, schema.positive_number, _MS)
    retry_attempts: int = config_key(2, schema.integer, Bounds(0, 100))
    retry_backoff_ms: float = config_key(2.0, schema.positive_number, Bounds(0.001, 60_000))
    retry_backoff_max_ms: float = config_key(50.0, schema.positive_number, Bounds(0.001, 60_000))
    breaker_failures: int = config_key(5, schema.integer, Bounds(1, 1_000_000))
    probe_interval_s: float = config_key(2.0, schema.positive_number, Bounds(0.001, 3600))
    fail_open: bool = config_key(True, schema.boolean)
    warmup_keys: int = config_key(64, schema.integer, Bounds(0, 65536))
    warmup_timeout_ms: float = config_key(1000.0, schema.positive_number, _MS)
    require_registration: bool = config_key(False, schema.boolean)
    put_registered: bool = config_key(False, schema.boolean)
    max_value_bytes: int = config_key(4 * MiB, schema.size, sizes(1, 4 * GiB))
    block_nbytes: int | None = config_key(None, schema.optional_size, sizes(1, 4 * GiB))
    metrics: bool = config_key(True, schema.boolean)  # Prometheus series, see observability/metrics.py
    metrics_port: int | None = config_key(None, schema.optional_integer, Bounds(1, 65535))  # when vLLM's cannot
    metrics_host: str = config_key("127.0.0.1", schema.listen_address)  # where metrics_port listens
    model_id: str | None = config_key(None, schema.model_name)  # goes into every key; see keys/identity.py
    put_mode: str = config_key("write_behind", schema.put_mode)  # or coalesce, direct: docs/write-behind.md
    write_behind_max_bytes: int = config_key(512 * MiB, schema.size, sizes(1, 1024 * GiB))
    write_behind_max_age_ms: float = config_key(2000.0, schema.positive_number, _MS)
    write_behind_close_timeout_ms: float = config_key(2000.0, schema.positive_number, _MS)

    # ----------------------------------------------------------- derived
    @property
    def scheme(self) -> str:
        return self.remote_url.partition("://")[0]

    @property
    def endpoint(self) -> str:
        """remote_url without its scheme or a trailing slash: what
        Client.init receives."""
        return self.remote_url.partition("://")[2].rstrip("/")

    @property
    def uses_embedded_engine(self) -> bool:
        return self.scheme == "local"

    # ----------------------------------------------------------- builders
    @classmethod
    def load(cls, path: str, node_checks: bool = True, overrides: Mapping[str, str] | None = None) -> "EICConfig":
        """Read and validate the YAML file at `path`; every problem found is
        in the one ConfigError raised. node_checks=False leaves out what
        depends on this host's files (node_problems), for checking a config
        away from where it runs. overrides: raw values by key, from the
        AIBRIX_EIC_<KEY> variables (env_overrides), which win over the file."""
        config_file = ConfigFile(path)
        problems = list(config_file.problems)
        overrides = overrides or {}
        given = config_file.values.keys() | overrides.keys()
        if "remote_url" not in given and not any(p.key == "remote_url" for p in problems):
            problems.append(Problem("remote_url", "is required", "add `remote_url: eic://HOST:PORT` (or local://)"))
        return cls._build(config_file.values, path, config_file.lines, problems, node_checks, overrides)

    @classmethod
    def from_mapping(cls, data: Mapping[Any, Any], source: str = DEFAULT_SOURCE) -> "EICConfig":
        """Validate a mapping (already parsed YAML, whose keys need not be names)."""
        return cls._build(data, source, {}, [], node_checks=True)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, node_checks: bool = True) -> "EICConfig":
        """The config named by the environment (or defaults when none is),
        with the AIBRIX_EIC_<KEY> variables set there overriding it."""
        env = os.environ if environ is None else environ
        path = config_path_from_env(env)
        overrides = env_overrides(env)
        if path:
            return cls.load(path, node_checks, overrides)
        if not overrides:
            return cls()
        return cls._build({}, ENV_SOURCE, {}, [], node_checks, overrides)

    @classmethod
    def _build(
        cls,
        data: Mapping[Any, Any],  # keys unchecked: _build refuses those that are not names
        source: str,
        lines: Mapping[str, int],
        problems: list[Problem],
        node_checks: bool,
        overrides: Mapping[str, str] | None = None,
    ) -> "EICConfig":
        """Check every key, then the keys together; raise all problems at once."""
        overrides = overrides or {}
        data = {key: raw for key, raw in data.items() if key not in overrides}
        lines = {key: line for key, line in lines.items() if key not in overrides}
        values = _checked_values(data, source, lines, problems)
        for key, raw in overrides.items():
            try:
                values[key] = KEY_CHECKS[key](source, key, raw, BOUNDS.get(key))
            except ConfigError as e:
                problems.append(Problem(key, e.problem, _variable_fix(key), variable=env_variable(key)))
        overridden_by = tuple(env_variable(key) for key in overrides)
        config = cls(source=source, lines=dict(lines), overridden_by=overridden_by, **values)
        return config._raise_problems(problems, node_checks)

    def overridden(self, data: Mapping[Any, Any], source: str) -> "EICConfig":
        """This config with the keys of `data` in place of its own (vLLM's
        secondary_tiers entry over the file and the AIBRIX_EIC_<KEY>
        variables), each key checked as in a file and the keys checked
        together; every problem in one ConfigError naming both sources."""
        problems: list[Problem] = []
        values = _checked_values(data, source, {}, problems)
        both = source if self.source == DEFAULT_SOURCE else f"{self.source} + {source}"
        lines = {key: line for key, line in self.lines.items() if key not in data}  # the file's lines still true
        replaced = {env_variable(key) for key in values}
        overridden_by = tuple(variable for variable in self.overridden_by if variable not in replaced)
        merged = dataclasses.replace(self, source=both, lines=lines, overridden_by=overridden_by, **values)
        return merged._raise_problems(problems, node_checks=bool(values))

    def _raise_problems(self, problems: list[Problem], node_checks: bool) -> "EICConfig":
        """Add the combination (and node) problems to `problems`; raise them all, or return self."""
        config = self
        failed = {problem.key for problem in problems}
        found = config._combination_problems() + (node_problems(config) if node_checks else [])
        for problem in found:
            if problem.key not in failed and _DEPENDS_ON.get(problem.key or "") not in failed:
                variable = env_variable(problem.key) if problem.key else None
                problems.append(
                    dataclasses.replace(problem, variable=variable if variable in self.overridden_by else None)
                )
        if problems:
            raise ConfigError.of(self.source, sorted(problems, key=lambda p: p.line or 0))
        return config

    # ---------------------------------------------------------- validation
    def _combination_problems(self) -> list[Problem]:
        """What is wrong with the keys together (each alone was valid)."""
        problems = []
        scheme, sep, rest = self.remote_url.partition("://")
        if not sep or scheme not in SCHEMES:
            problems.append(
                Problem(
                    "remote_url",
                    f"expected eic://host:port or local://[name][?params], got {self.remote_url!r}",
                    "write `eic://HOST:PORT` for an EIC cluster or `local://` for the embedded engine",
                )
            )
        elif scheme == "eic":
            if not rest.strip("/"):
                problems.append(
                    Problem(
                        "remote_url", f"eic:// needs a host:port, got {self.remote_url!r}", "add the agent's HOST:PORT"
                    )
                )
            if not self.eic_instance_id:
                problems.append(
                    Problem(
                        "eic_instance_id",
                        "is required for eic:// (the EIC cluster UUID)",
                        "add `eic_instance_id: <the cluster's UUID>`",
                    )
                )
        else:
            from ..engine.endpoint import parse_endpoint

            try:
                parse_endpoint(rest)
            except ValueError as e:
                problems.append(
                    Problem("remote_url", str(e), f"correct the local:// parameter named ({docs_url('engine.md')})")
                )
        if self.eic_kv_ttl == 0 or self.eic_kv_ttl < -1:
            problems.append(
                Problem(
                    "eic_kv_ttl",
                    f"expected -1 (no expiry) or seconds > 0, got {self.eic_kv_ttl}",
                    "write -1, or the seconds a value lives",
                )
            )
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            problems.append(
                Problem(
                    "retry_backoff_max_ms",
                    f"must be >= retry_backoff_ms ({self.retry_backoff_ms:g}), got {self.retry_backoff_max_ms:g}",
                    f"raise retry_backoff_max_ms to at least {self.retry_backoff_ms:g}, or lower retry_backoff_ms",
                )
            )
        if self.block_nbytes is not None and self.block_nbytes > self.max_value_bytes:
            problems.append(
                Problem(
                    "block_nbytes",
                    f"{self.block_nbytes} exceeds max_value_bytes ({self.max_value_bytes})",
                    "raise max_value_bytes to at least block_nbytes, or correct block_nbytes",
                )
            )
        return [dataclasses.replace(p, line=self.lines.get(p.key or "")) for p in problems]


def node_problems(config: EICConfig) -> list[Problem]:
    """What the config needs from the host it runs on: the SDK flag file, a
    log directory that is not a file. A config checked elsewhere
    (`aibrix-eic check --config-only`) reports these as warnings."""
    problems = []
    flag_file = config.eic_flag_file
    if flag_file is not None and not os.path.isfile(flag_file):
        problems.append(
            Problem(
                "eic_flag_file",
                f"{flag_file} does not exist",
                "create the file on this node (in Kubernetes: mount it from a ConfigMap), or remove eic_flag_file",
                config.lines.get("eic_flag_file"),
            )
        )
    log_dir = config.eic_log_dir
    if log_dir is not None and os.path.exists(log_dir) and not os.path.isdir(log_dir):
        problems.append(
            Problem(
                "eic_log_dir",
                f"{log_dir} exists and is not a directory",
                "name a directory, or remove the file",
                config.lines.get("eic_log_dir"),
            )
        )
    return problems


# Derived from the declarations above: the check of every key, and the bounds
# of every number and size.
KEY_CHECKS = {f.name: f.metadata["check"] for f in dataclasses.fields(EICConfig) if "check" in f.metadata}
BOUNDS: dict[str, Bounds] = {
    f.name: f.metadata["bounds"] for f in dataclasses.fields(EICConfig) if f.metadata.get("bounds") is not None
}
# Keys checked against another: not when that other one was refused.
_DEPENDS_ON = {
    "retry_backoff_max_ms": "retry_backoff_ms",
    "block_nbytes": "max_value_bytes",
    "eic_instance_id": "remote_url",
}
_FIELDS = {f.name: f for f in dataclasses.fields(EICConfig) if "check" in f.metadata}


ENV_PREFIX = "AIBRIX_EIC_"


def env_variable(key: str) -> str:
    """The variable that overrides a config key: put_mode -> AIBRIX_EIC_PUT_MODE."""
    return ENV_PREFIX + key.upper()


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Raw values by key of the AIBRIX_EIC_<KEY> variables that are set. Only
    names of config keys are read: other AIBRIX_EIC_* variables (switches
    such as AIBRIX_EIC_DISABLE_AUTOLOAD) are not config and not refused."""
    env = os.environ if environ is None else environ
    return {key: env[env_variable(key)] for key in KEY_CHECKS if env_variable(key) in env}


def _checked_values(
    data: Mapping[Any, Any], source: str, lines: Mapping[str, int], problems: list[Problem]
) -> dict[str, Any]:
    """Each key of `data` checked alone: the values, with every problem appended to `problems`."""
    values: dict[str, Any] = {}
    for key, raw in data.items():
        if not isinstance(key, str):
            problems.append(Problem(repr(key), "keys must be names", "write the key as a name, such as eic_kv_ns"))
            continue
        line = lines.get(key)
        if key not in KEY_CHECKS:
            problems.append(_unknown_key(key, line))
        else:
            try:
                values[key] = KEY_CHECKS[key](source, key, raw, BOUNDS.get(key))
            except ConfigError as e:
                problems.append(Problem(key, e.problem, e.fix or _value_fix(key), line))
    return values


def config_path_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The config path from our variable, else the upstream one, else ""."""
    env = os.environ if environ is None else environ
    return (env.get(ENV_CONFIG) or env.get(ENV_CONFIG_UPSTREAM) or "").strip()


def warn_about_env(environ: Mapping[str, str] | None = None) -> None:
    """Say which config the connector will read when that may surprise: both
    variables set to different files, or neither (the embedded engine)."""
    env = os.environ if environ is None else environ
    ours, theirs = env.get(ENV_CONFIG), env.get(ENV_CONFIG_UPSTREAM)
    if ours and theirs and ours != theirs:
        logger.warning("%s=%s and %s=%s differ; using %s", ENV_CONFIG, ours, ENV_CONFIG_UPSTREAM, theirs, ours)
    if not config_path_from_env(env):
        logger.warning(
            "Neither %s nor %s is set: the EIC connector runs on the embedded engine "
            "(local://) with default settings; cached KV lives in this process only",
            ENV_CONFIG,
            ENV_CONFIG_UPSTREAM,
        )


def _unknown_key(key: str, line: int | None) -> Problem:
    """An unknown key, with the key meant when it can be told."""
    if key in _FOREIGN_KEYS:
        why, instead = _FOREIGN_KEYS[key]
        fix = f"rename {key} to {instead}" if instead else f"remove {key}"
        return Problem(key, f"unknown key ({why})", fix, line)
    close = difflib.get_close_matches(key, sorted(KEY_CHECKS), n=1, cutoff=0.6)
    if close:
        return Problem(key, f"unknown key; did you mean {close[0]!r}?", f"rename {key} to {close[0]}", line)
    return Problem(
        key, "unknown key", f"remove {key}; {docs_url('config.md')} lists the keys this connector reads", line
    )


def _variable_fix(key: str) -> str:
    expected = schema.expectation(KEY_CHECKS[key], BOUNDS.get(key))
    return f"set {env_variable(key)} to {expected}, or unset it to use the file's value or the default"


def _value_fix(key: str) -> str:
    field = _FIELDS[key]
    bounds = BOUNDS.get(key)
    expected = schema.expectation(KEY_CHECKS[key], bounds)
    if field.default is None:
        return f"write {expected}, or remove the line to leave {key} unset"
    return f"write {expected}, or remove the line to get the default, {schema.value_text(field.default, bounds)}"
