"""The relay's Helm chart (deploy/helm/outbox-relay) and the example Spark job: `helm lint`,
`helm template`, and every rendered manifest decoded strictly into the Kubernetes API's own types
(outbox_dev/go/kubecheck); and what a platform team needs of it, read off the rendered objects."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from outbox.relay import config_file
from outbox.relay.settings import SETTINGS
from outbox_dev import gotools
from tests.helpers import REPO

CHART = REPO / "deploy" / "helm" / "outbox-relay"
REQUIRED = ("--set", "relay.bootstrapServers=kafka-0.kafka:9093", "--set", "secrets.name=outbox-secrets")
FULL = (
    *REQUIRED,
    *("--set", "serviceMonitor.enabled=true", "--set", "secrets.databasePassword=database-password"),
    *("--set", "secrets.kafkaSaslPassword=kafka-password", "--set", "relay.settings.on-poison=dead-letter"),
    *("--set-string", "relay.kafka.security\\.protocol=SASL_SSL", "--set", "relay.kafka.linger\\.ms=5"),
)


def run(*argv: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], input=stdin, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.fixture(scope="module")
def helm() -> Path:
    return gotools.helm()


@pytest.fixture(scope="module")
def kubecheck() -> Path:
    return gotools.kubecheck()


def rendered(helm: Path, *values: str) -> str:
    result = run(helm, "template", "orders", CHART, *values)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_chart_lints_strictly(helm: Path) -> None:
    result = run(helm, "lint", "--strict", CHART, *FULL)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_rendered_manifest_is_valid_kubernetes(helm: Path, kubecheck: Path) -> None:
    checked = run(kubecheck, stdin=rendered(helm, *FULL))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    kinds = sorted(line.split()[1] for line in checked.stdout.splitlines())
    assert kinds == [
        "apps/v1/Deployment",
        "monitoring.coreos.com/v1/ServiceMonitor",
        "policy/v1/PodDisruptionBudget",
        "v1/ConfigMap",
        "v1/Service",
    ], checked.stdout


def test_the_checker_refuses_a_misspelt_field_and_a_wrong_type(helm: Path, kubecheck: Path) -> None:
    text = rendered(helm, *FULL)
    for wrong in (
        text.replace("readOnlyRootFilesystem: true", "readOnlyRootFilesytem: true"),
        text.replace("replicas: 2", "replicas: two"),
    ):
        checked = run(kubecheck, stdin=wrong)
        assert checked.returncode == 1 and "invalid: " in checked.stdout, checked.stdout


def test_the_example_spark_job_is_valid_kubernetes(kubecheck: Path) -> None:
    checked = run(kubecheck, stdin=(REPO / "deploy" / "kubernetes" / "spark-sink-job.yaml").read_text())
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok batch/v1/Job orders-sink" in checked.stdout


def _objects(text: str) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text) if doc}


def test_the_relay_runs_active_and_standby_non_root_read_only_with_both_probes(helm: Path) -> None:
    objects = _objects(rendered(helm, *FULL))
    deployment = objects["Deployment"]["spec"]
    pod = deployment["template"]["spec"]
    (relay,) = pod["containers"]
    assert deployment["replicas"] == 2
    assert relay["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert relay["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert relay["securityContext"]["readOnlyRootFilesystem"] is True
    assert relay["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["terminationGracePeriodSeconds"] > 25  # above --stop-timeout's 25 s
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert objects["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    env = {e["name"]: e["value"] for e in relay["env"]}
    mounts = {m["name"]: m["mountPath"] for m in relay["volumeMounts"]}
    for variable in ("DATABASE_URL_FILE", "DATABASE_PASSWORD_FILE", "KAFKA_SASL_PASSWORD_FILE"):
        assert env[variable].startswith(mounts["secrets"] + "/"), env
    (secret,) = [v for v in pod["volumes"] if "secret" in v]
    assert secret["secret"]["secretName"] == "outbox-secrets"
    assert objects["ServiceMonitor"]["spec"]["endpoints"][0]["port"] == "metrics"


def test_the_rendered_config_file_is_one_the_relay_reads(helm: Path, tmp_path: Path) -> None:
    config = _objects(rendered(helm, *FULL))["ConfigMap"]["data"]["relay.toml"]
    (tmp_path / "relay.toml").write_text(config)
    found = config_file.read(tmp_path / "relay.toml", {s.key for s in SETTINGS})
    assert found.values["name"] == "orders" and found.values["on_poison"] == "dead-letter"
    assert found.values["stop_timeout"] == "25" and found.values["metrics_address"] == "0.0.0.0:9400"
    assert found.kafka == {"security.protocol": "SASL_SSL", "linger.ms": "5"}


def test_the_chart_says_what_it_needs_in_one_line(helm: Path) -> None:
    result = run(helm, "template", "orders", CHART)
    assert result.returncode != 0 and "relay.bootstrapServers is required" in result.stderr, result.stderr
