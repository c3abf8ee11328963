"""Deployment files: valid YAML and JSON, Kubernetes and compose schemas where a validator is
installed, and cross-references (ports, probes, mounts, config) that agree with the code."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from promptsched import config as configuration
from promptsched.durations import parse_duration

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
GRAFANA = ROOT / "grafana"
YAML_FILES = sorted(
    [*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml"), *GRAFANA.rglob("*.yaml")],
    key=lambda p: str(p),
)
MANIFESTS = sorted(K8S.rglob("*.yaml"), key=lambda p: str(p))
# Custom resources of the Prometheus Operator: no schema ships with the Kubernetes validator.
CRDS = {"ServiceMonitor", "PrometheusRule"}
# What the supervisor may still write after the drain grace: shielded final writes.
FINAL_WRITES = timedelta(seconds=10)
SEVERITIES = ("info", "warning", "critical")


def _docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _manifest(kind: str) -> dict[str, Any]:
    found = [doc for path in MANIFESTS for doc in _docs(path) if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- every file parses ----------------------------------------------------------------------


@pytest.mark.parametrize("path", YAML_FILES, ids=_rel)
def test_yaml_files_parse_to_mappings(path: Path) -> None:
    docs = _docs(path)
    assert docs and all(isinstance(doc, dict) for doc in docs)


def test_the_expected_files_exist() -> None:
    kinds = {doc["kind"] for path in MANIFESTS for doc in _docs(path)}
    assert kinds == {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ServiceMonitor",
        "PrometheusRule",
        "HorizontalPodAutoscaler",
        "Job",
    }
    for name in ("Dockerfile", "compose.yaml", "prometheus.yml", "alerts.yml"):
        assert (DEPLOY / name).is_file(), name


# --- Kubernetes -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", MANIFESTS, ids=_rel)
def test_manifests_match_the_kubernetes_schemas(path: Path) -> None:
    validator = pytest.importorskip("kubernetes_validate")
    for doc in _docs(path):
        assert {"apiVersion", "kind", "metadata"} <= doc.keys()
        if doc["kind"] in CRDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        validator.validate(doc, validator.latest_version(), strict=True)


def _container() -> dict[str, Any]:
    containers = _manifest("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _env(container: dict[str, Any]) -> dict[str, str]:
    # Values from secrets and the downward API are stood in for by placeholders.
    return {
        item["name"]: str(item.get("value", f"postgresql://from-{item['name'].lower()}/x"))
        for item in container["env"]
    }


def _known_variable(name: str) -> bool:
    known = {configuration.env_name(setting) for setting in configuration.SETTINGS}
    extra = ("PROMPTSCHED_CONFIG", "PROMPTSCHED_PROVIDERS")
    return name in known or name in extra or name.startswith("PROMPTSCHED_PROVIDER_")


def _check_config(env: dict[str, str]) -> configuration.Config:
    unknown = [
        name for name in env if name.startswith("PROMPTSCHED_") and not _known_variable(name)
    ]
    assert unknown == [], "variables promptsched does not read"
    return configuration.load(env=env)  # raises ConfigError naming a bad field


def test_the_deployment_probes_drains_and_runs_unprivileged() -> None:
    deployment = _manifest("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = _container()
    config = _check_config(_env(container))
    assert config.database_url and config.http_host == "0.0.0.0"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": config.http_port}
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    grace = timedelta(seconds=pod["terminationGracePeriodSeconds"])
    assert grace > config.drain_grace + FINAL_WRITES, "SIGKILL would cut the drain short"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert deployment["spec"]["replicas"] >= 2


def test_the_schema_is_migrated_first_by_the_same_image() -> None:
    """docs/deploying.md, "Upgrading": `promptsched migrate` before the new replicas, as the
    Deployment's init container and as a Job of its own; same image, same database."""
    pod = _manifest("Deployment")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    job = _manifest("Job")
    (step,) = job["spec"]["template"]["spec"]["containers"]
    for container in (init, step):
        assert container["args"] == ["migrate"]
        assert container["image"] == _container()["image"]
        assert _check_config(_env(container)).database_url
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert job["metadata"]["name"].endswith(_container()["image"].rsplit(":", 1)[1])
    # The Job's pod is no replica: the Service and the PodDisruptionBudget do not select it.
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    for kind in ("Service", "PodDisruptionBudget"):
        spec = _manifest(kind)["spec"]
        selector = spec.get("selector", {})
        selector = selector.get("matchLabels", selector)
        assert not selector.items() <= pod_labels.items(), kind
    compose = _compose()
    migrate = compose["services"]["migrate"]
    assert migrate["command"] == ["migrate"] and migrate["restart"] == "no"
    assert _check_config({k: str(v) for k, v in migrate["environment"].items()}).database_url
    for replica in _replicas(compose).values():
        assert replica["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}


def test_service_pdb_monitor_and_hpa_point_at_the_deployment() -> None:
    deployment = _manifest("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = _manifest("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container_ports = {port["name"] for port in _container()["ports"]}
    assert {port["targetPort"] for port in service["spec"]["ports"]} <= container_ports
    pdb = _manifest("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"], "drains would block"
    monitor = _manifest("ServiceMonitor")
    wanted = monitor["spec"]["selector"]["matchLabels"]
    assert wanted.items() <= service["metadata"]["labels"].items()
    service_ports = {port["name"] for port in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports and endpoint["path"] == "/metrics"
    hpa = _manifest("HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] > pdb["spec"]["minAvailable"]


def test_the_prometheus_rule_is_the_alerts_file() -> None:
    alerts = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    assert _manifest("PrometheusRule")["spec"] == alerts


def test_alert_rules_are_complete() -> None:
    alerts = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    rules = [rule for group in alerts["groups"] for rule in group["rules"]]
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert rule["expr"].strip() and rule["labels"]["severity"] in SEVERITIES
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        if "for" in rule:
            parse_duration(rule["for"], field=rule["alert"])
    wanted = ("DeadLetters", "TicksDropped", "TickLag", "StuckLeases", "OutboxBacklog")
    for topic in (*wanted, "NoSchedulerAlive"):
        assert any(topic in name for name in names), topic


# --- compose and Prometheus -----------------------------------------------------------------


def _compose() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return compose


def _replicas(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if name.startswith("promptsched")}


def test_compose_matches_the_compose_spec() -> None:
    pytest.importorskip("check_jsonschema")
    jsonschema = pytest.importorskip("jsonschema")
    schema_file = resources.files("check_jsonschema") / "builtin_schemas/vendor/compose-spec.json"
    schema = json.loads(schema_file.read_text())
    jsonschema.validate(_compose(), schema)


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path (relative to deploy/) for each bind mount."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = (DEPLOY / source).resolve()
    return mounts


def test_compose_runs_two_replicas_of_this_repo_against_postgres() -> None:
    compose = _compose()
    replicas = _replicas(compose)
    assert len(replicas) == 2
    for service in replicas.values():
        build = service["build"]
        assert (DEPLOY / build["context"]).resolve() == ROOT
        assert (ROOT / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
        env = {key: str(value) for key, value in service["environment"].items()}
        config = _check_config(env)
        assert config.database_url and "@postgres:" in config.database_url
        assert "postgres" in service["depends_on"]
        grace = parse_duration(service["stop_grace_period"], field="stop_grace_period")
        assert grace > config.drain_grace + FINAL_WRITES
    assert "postgres" in compose["services"]


def test_prometheus_scrapes_both_replicas_and_loads_the_alerts() -> None:
    compose = _compose()
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    expected = {
        f"{name}:{service['environment']['PROMPTSCHED_HTTP_PORT']}"
        for name, service in _replicas(compose).items()
    }
    assert targets == expected and job.get("metrics_path", "/metrics") == "/metrics"
    mounts = _mounts(compose["services"]["prometheus"])
    for rule_file in prometheus["rule_files"]:
        assert mounts[rule_file] == DEPLOY / "alerts.yml"
    assert mounts["/etc/prometheus/prometheus.yml"] == DEPLOY / "prometheus.yml"


def test_grafana_is_provisioned_with_the_dashboard() -> None:
    mounts = _mounts(_compose()["services"]["grafana"])
    assert mounts["/etc/grafana/provisioning"] == GRAFANA / "provisioning"
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/promptsched.yaml").read_text())
    (provider,) = providers["providers"]
    assert mounts[provider["options"]["path"]] == GRAFANA / "dashboards"
    datasources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())
    (datasource,) = datasources["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"


# --- the dashboard is importable ------------------------------------------------------------


def test_the_dashboard_is_importable_with_a_datasource_variable() -> None:
    dashboard = json.loads((GRAFANA / "dashboards/promptsched.json").read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}" and target["expr"]


# --- the Dockerfile installs this repo the way the README does --------------------------------


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def _copied(steps: list[tuple[str, str]]) -> set[str]:
    """Sources the Dockerfile copies from the build context."""
    return {
        source
        for keyword, rest in steps
        if keyword == "COPY" and "--from" not in rest
        for source in rest.split()[:-1]
    }


def _pip_targets(command: str) -> list[list[str]]:
    """The arguments after ``pip install`` in each install command of a shell line."""
    targets = []
    for part in re.split(r"&&|;", command):
        try:
            words = shlex.split(part, comments=True)
        except ValueError:  # prose, not a command
            continue
        for i, word in enumerate(words[:-1]):
            if word.endswith("pip") and words[i + 1] == "install":
                args = words[i + 2 :]
                # An option's own value (-c requirements.lock) is not a target.
                valued = {j + 1 for j, w in enumerate(args) if w in VALUED_PIP_OPTIONS}
                targets.append(
                    [w for j, w in enumerate(args) if not w.startswith("-") and j not in valued]
                )
    return targets


VALUED_PIP_OPTIONS = ("-c", "--constraint", "-r", "--requirement", "--config-settings")


def _constraints(command: str) -> list[str | None]:
    """For each ``pip install`` of a shell line, the constraints file it names (or None)."""
    found: list[str | None] = []
    for part in re.split(r"&&|;", command):
        try:
            words = shlex.split(part, comments=True)
        except ValueError:
            continue
        for i, word in enumerate(words[:-1]):
            if word.endswith("pip") and words[i + 1] == "install":
                args = words[i + 2 :]
                named = [args[j + 1] for j, w in enumerate(args[:-1]) if w == "-c"]
                found.append(named[0] if named else None)
    return found


def test_the_dockerfile_pip_installs_this_repo_into_a_slim_non_root_image() -> None:
    steps = _instructions()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = _copied(steps)
    assert {"pyproject.toml", pyproject["project"]["readme"], "promptsched"} <= copied
    installs = [t for keyword, rest in steps if keyword == "RUN" for t in _pip_targets(rest)]
    assert installs == [["."]], installs
    bases = [rest.split()[0] for keyword, rest in steps if keyword == "FROM"]
    assert bases[-1].endswith("-slim"), "the runtime stage is not slim"
    users = [rest for keyword, rest in steps if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    # The health check asks the port the service announced (tests/test_healthcheck.py), not
    # the one a variable names: `run --http-port` keeps a healthy container healthy.
    healthcheck = " ".join(rest for keyword, rest in steps if keyword == "HEALTHCHECK")
    assert json.loads(healthcheck.split("CMD", 1)[1]) == ["promptsched", "healthcheck"]
    entrypoint = json.loads(next(rest for keyword, rest in steps if keyword == "ENTRYPOINT"))
    assert entrypoint == list(pyproject["project"]["scripts"])


def test_the_image_keeps_the_embedded_data_directory_in_a_volume_owned_by_its_user() -> None:
    steps = _instructions()
    env: dict[str, str] = {}
    for keyword, rest in steps:
        if keyword == "ENV":
            env.update(dict(pair.split("=", 1) for pair in shlex.split(rest)))
    data_dir = env["PROMPTSCHED_DATA_DIR"]
    volumes = [
        path
        for keyword, rest in steps
        if keyword == "VOLUME"
        for path in (json.loads(rest) if rest.startswith("[") else rest.split())
    ]
    assert data_dir in volumes, (data_dir, volumes)
    # The runtime user (uid 10001, not root) owns it: created as its home directory.
    (user,) = [rest for keyword, rest in steps if keyword == "USER"]
    assert user.split(":")[0] not in ("root", "0")
    useradd = next(rest for keyword, rest in steps if keyword == "RUN" and "useradd" in rest)
    assert f"--uid {user.split(':')[0]}" in useradd
    assert f"--home-dir {data_dir}" in useradd and "--create-home" in useradd
    # VOLUME comes after everything that fills the directory (later changes would be lost).
    keywords = [keyword for keyword, _ in steps]
    assert keywords.index("VOLUME") > max(
        i for i, (keyword, rest) in enumerate(steps) if keyword == "RUN" and "useradd" in rest
    )


def test_the_readme_installs_the_same_package_as_the_dockerfile() -> None:
    # The README installs with `make`, whose recipe is in the Makefile; read both.
    text = (ROOT / "README.md").read_text() + "\n" + (ROOT / "Makefile").read_text()
    lines = re.sub(r"\\\n", " ", text).splitlines()
    targets = [t for line in lines for command in _pip_targets(line) for t in command]
    local = [t.strip("'\"") for t in targets if t.strip("'\"").startswith(".")]
    assert local, "the README (or the Makefile it runs) installs no local package"
    # Extras (.[dev]) and -e aside, it is this repository: the package the Dockerfile installs.
    assert all(re.fullmatch(r"\.(\[[\w,-]+\])?", t) for t in local), local


def test_the_docker_build_context_keeps_what_the_dockerfile_copies() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    kept = {line[1:].split("/")[0] for line in ignore if line.startswith("!")}
    copied = _copied(_instructions())
    assert copied <= kept


# --- reproducible builds: one lock file for the image and `make run` -------------------------


def _locked() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version and re.fullmatch(r"[\w.+-]+", version), f"not an exact pin: {line}"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_the_lock_pins_every_dependency_of_the_service() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    locked = _locked()
    for requirement in pyproject["project"]["dependencies"]:
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]
        assert re.sub(r"[-_.]+", "-", name).lower() in locked, f"{name} is not in the lock"


def test_the_image_and_make_install_with_the_lock_and_the_runtime_has_no_installer() -> None:
    steps = _instructions()
    dockerfile = [c for keyword, rest in steps if keyword == "RUN" for c in _constraints(rest)]
    assert dockerfile == ["requirements.lock"], dockerfile
    assert "requirements.lock" in _copied(steps)
    makefile = re.sub(r"\\\n", " ", (ROOT / "Makefile").read_text())
    # `make run` and `make test` install into .venv ($(BIN)); `make lock` resolves afresh.
    installs = [
        c for line in makefile.splitlines() if "$(BIN)/pip" in line for c in _constraints(line)
    ]
    assert installs and all(c == "requirements.lock" for c in installs), installs
    # The runtime stage (after the last FROM) removes pip and setuptools; the build stage's
    # virtualenv, which it copies, has them uninstalled too.
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    runtime = " ".join(rest for keyword, rest in steps[last_from:] if keyword == "RUN")
    build = " ".join(rest for keyword, rest in steps[:last_from] if keyword == "RUN")
    for stage in (runtime, build):
        assert re.search(r"pip uninstall --yes[^&;]*\bpip\b[^&;]*\bsetuptools\b", stage), stage
