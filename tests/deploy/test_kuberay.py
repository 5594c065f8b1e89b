"""kuberay/: every manifest checked as the Kubernetes API server would check it, and the RayJob's
entrypoint checked as the study checks its own input. No Kubernetes runs here.

RayCluster and RayJob are validated against KubeRay v1.7.0's own CRD schemas (``tests/deploy/kuberay-crds``,
or ``$KUBERAY_CRDS``). The API server rejects unknown fields (strict field validation, and structural
schemas prune them), so every object schema that lists its properties is closed here
(``additionalProperties: false``) unless it says ``x-kubernetes-preserve-unknown-fields``; the CEL rules
(``x-kubernetes-validations``) are not evaluated.

The standard objects (Secret, PersistentVolumeClaim, Service, Deployment, StatefulSet) are checked by
a small schema of our own for each object's outer shape, whose inner parts are Kubernetes' own schemas
as the KubeRay CRD embeds them: a pod template is the CRD's ``PodTemplateSpec`` (the same one a Ray
head's template is checked with), a claim's spec the CRD's ``PersistentVolumeClaimSpec``, a Service's
spec the CRD's ``ServiceSpec`` (the head Service's), metadata the CRD's ``ObjectMeta``.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

from conftest import CI

REPO = Path(__file__).resolve().parents[2]
KUBERAY = REPO / "kuberay"
CRDS = Path(os.environ.get("KUBERAY_CRDS", REPO / "tests" / "deploy" / "kuberay-crds"))
NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # RFC 1123 label: Service and claim names


def manifests(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((KUBERAY / name).read_text()) if d]


def every_manifest() -> list[tuple[str, dict]]:
    return [(p.name, d) for p in sorted(KUBERAY.glob("*.yaml")) for d in manifests(p.name)]


def closed(schema):
    """The schema with every listed-properties object closed to other fields, as the API server is."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and not out.get(
            "x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@cache
def crd_schema(kind: str) -> dict:
    crd = _crd(kind)
    assert crd["spec"]["names"]["kind"] == kind
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = copy.deepcopy(v1["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = object_meta()
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    schema["properties"]["apiVersion"] = {"const": "ray.io/v1"}
    schema["properties"]["kind"] = {"const": kind}
    return closed(schema)


@cache
def _crd(kind: str) -> dict:
    """The CRD file, parsed once (2 MB of YAML: libyaml's loader where PyYAML has it)."""
    path = CRDS / f"ray.io_{kind.lower()}s.yaml"
    if not path.is_file():
        if CI:
            pytest.fail(f"KubeRay's CRDs are not at {CRDS} (set KUBERAY_CRDS): the manifests cannot be checked")
        pytest.skip(f"KubeRay's CRDs are not at {CRDS} (set KUBERAY_CRDS)")
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _cluster_spec() -> dict:
    """RayCluster's spec schema, shared: whoever changes a part copies it first."""
    (v1,) = [v for v in _crd("RayCluster")["spec"]["versions"] if v["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]


def object_meta(named: bool = True) -> dict:
    meta = copy.deepcopy(_cluster_spec()["headGroupSpec"]["properties"]["template"]["properties"]["metadata"])
    if named:
        meta["required"] = ["name"]
        meta["properties"]["name"] = {"type": "string", "pattern": NAME, "maxLength": 63}
    return meta


@cache
def standard_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> schema, for the Kubernetes objects kuberay/ ships beside the Ray ones."""
    spec = _cluster_spec()
    head = spec["headGroupSpec"]["properties"]
    pod_template = head["template"]
    volume = pod_template["properties"]["spec"]["properties"]["volumes"]["items"]["properties"]
    claim_spec = volume["ephemeral"]["properties"]["volumeClaimTemplate"]["properties"]["spec"]
    service_spec = head["headService"]["properties"]["spec"]
    selector = {"type": "object", "required": ["matchLabels"],
                "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}}

    def shell(api: str, kind: str, spec_schema: dict | None, **top) -> dict:
        props = {"apiVersion": {"const": api}, "kind": {"const": kind}, "metadata": object_meta(), **top}
        if spec_schema is not None:
            props["spec"] = spec_schema
        return closed({"type": "object", "properties": props,
                       "required": ["apiVersion", "kind", "metadata"] + (["spec"] if spec_schema else [])})

    return {
        ("v1", "Secret"): shell("v1", "Secret", None, type={"type": "string"},
                                stringData={"type": "object", "additionalProperties": {"type": "string"}},
                                data={"type": "object", "additionalProperties": {"type": "string"}}),
        ("v1", "PersistentVolumeClaim"): shell("v1", "PersistentVolumeClaim", claim_spec),
        ("v1", "Service"): shell("v1", "Service", service_spec),
        ("apps/v1", "Deployment"): shell("apps/v1", "Deployment", {
            "type": "object", "required": ["selector", "template"],
            "properties": {"replicas": {"type": "integer", "minimum": 0}, "selector": selector,
                           "template": pod_template,
                           "strategy": {"type": "object",
                                        "properties": {"type": {"enum": ["Recreate", "RollingUpdate"]}}}}}),
        ("apps/v1", "StatefulSet"): shell("apps/v1", "StatefulSet", {
            "type": "object", "required": ["selector", "template", "serviceName"],
            "properties": {"replicas": {"type": "integer", "minimum": 0}, "selector": selector,
                           "serviceName": {"type": "string"}, "template": pod_template,
                           "volumeClaimTemplates": {"type": "array", "items": {
                               "type": "object", "required": ["metadata", "spec"],
                               "properties": {"metadata": object_meta(), "spec": claim_spec}}}}}),
    }


def schema_of(doc: dict) -> dict:
    if doc.get("apiVersion") == "ray.io/v1":
        return crd_schema(doc["kind"])
    key = (doc.get("apiVersion"), doc.get("kind"))
    assert key in standard_schemas(), f"no schema for {key}: kuberay/ ships only what the test can check"
    return standard_schemas()[key]


def errors(doc: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(schema_of(doc))
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in validator.iter_errors(doc)]


def test_every_manifest_is_valid_for_the_api_server():
    docs = every_manifest()
    kinds = sorted({d["kind"] for _, d in docs})
    assert kinds == ["Deployment", "PersistentVolumeClaim", "RayCluster", "RayJob", "Secret", "Service",
                     "StatefulSet"], kinds
    for file, doc in docs:
        assert errors(doc) == [], f"kuberay/{file}: {doc['kind']} {doc['metadata'].get('name')}"


def _job() -> dict:
    (job,) = manifests("rayjob.yaml")
    return job


@pytest.mark.parametrize("breakage, expected", [
    ("unknown field", "Additional properties are not allowed ('replicaCount' was unexpected)"),
    ("wrong type", "'2' is not of type 'integer'"),
    ("missing required", "'groupName' is a required property"),
    ("misspelt container field", "Additional properties are not allowed ('imagePullPolicyy' was unexpected)"),
    ("bad enum", "'password' is not one of ['disabled', 'token']"),
])
def test_a_broken_manifest_is_refused(breakage, expected):
    """The check can fail: each deliberate breakage of a copy of the RayJob is named."""
    job = copy.deepcopy(_job())
    group = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    if breakage == "unknown field":
        group["replicaCount"] = 2
    elif breakage == "wrong type":
        group["replicas"] = "2"
    elif breakage == "missing required":
        del group["groupName"]
    elif breakage == "misspelt container field":
        group["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    else:
        job["spec"]["rayClusterSpec"]["authOptions"]["mode"] = "password"
    assert any(expected in e for e in errors(job)), errors(job)


def test_a_broken_standard_object_is_refused():
    """Our own shells are closed too, and their Kubernetes parts check types."""
    deployment = copy.deepcopy(next(d for _, d in every_manifest() if d["kind"] == "Deployment"))
    deployment["spec"]["replica"] = 1
    deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "5000"
    found = errors(deployment)
    assert any("'replica' was unexpected" in e for e in found), found
    assert any("'5000' is not of type 'integer'" in e for e in found), found


def _pods(doc: dict) -> list[dict]:
    spec = doc.get("spec", {})
    if doc["kind"] in ("RayCluster", "RayJob"):
        cluster = spec.get("rayClusterSpec", spec)
        pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
        return pods + ([spec["submitterPodTemplate"]] if "submitterPodTemplate" in spec else [])
    return [spec["template"]] if "template" in spec else []


def test_manifests_name_what_exists():
    """Every claim, secret key, Service and image they name is one kuberay/ ships or the repository builds."""
    docs = every_manifest()
    (secret,) = [d for _, d in docs if d["kind"] == "Secret"]
    claims = {d["metadata"]["name"] for _, d in docs if d["kind"] == "PersistentVolumeClaim"}
    services = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "Service"}
    for _, doc in docs:
        for pod in _pods(doc):
            for v in pod["spec"].get("volumes", []):
                if "persistentVolumeClaim" in v:
                    assert v["persistentVolumeClaim"]["claimName"] in claims, (doc["kind"], v)
            for c in pod["spec"]["containers"]:
                assert c["image"].split(":")[0] in ("mocolab", "postgres"), c["image"]
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"], ref
                for word in c.get("command", []):
                    if word.startswith("docker/"):
                        assert (REPO / word).is_file(), word
        if doc["kind"] in ("Deployment", "StatefulSet"):
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items()
            # some Service selects these pods, on a port the container listens on
            ports = {p["containerPort"] for c in doc["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
            matching = [s for s in services.values() if s["spec"]["selector"].items() <= labels.items()]
            assert matching and all(p["targetPort"] in ports for s in matching for p in s["spec"]["ports"])
    # KubeRay reads the token from the Secret's key auth_token (authOptions.secretName)
    assert "auth_token" in secret["stringData"]


@pytest.mark.parametrize("file", ["raycluster.yaml", "rayjob.yaml"])
def test_ray_clusters_have_token_auth_mlflow_and_shared_storage(file):
    (doc,) = manifests(file)
    cluster = doc["spec"].get("rayClusterSpec", doc["spec"])
    assert cluster["rayVersion"] == ray.__version__, f"kuberay/{file}: rayVersion is not the installed Ray"
    (secret,) = manifests("secrets.example.yaml")
    assert cluster["authOptions"] == {"mode": "token", "secretName": secret["metadata"]["name"]}
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    mlflow = {s["metadata"]["name"]: s for s in manifests("mlflow.yaml") if s["kind"] == "Service"}["mlflow"]
    for pod in _pods({"kind": "RayCluster", "spec": cluster}):
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        for c in pod["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in c["env"]}
            # the MLflow Service of kuberay/mlflow.yaml, on its port
            assert env["MLFLOW_TRACKING_URI"] == f"http://{mlflow['metadata']['name']}:{mlflow['spec']['ports'][0]['port']}"
            assert env["MOCOLAB_STORAGE"].startswith("/shared/")
            assert any(m["mountPath"] == "/shared" for m in c["volumeMounts"])
    gpu = [g for g in cluster["workerGroupSpecs"]
           if g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")]
    assert gpu and all(g["rayStartParams"]["num-gpus"] == "1" for g in gpu)


def _documented_cpus_per_gpu() -> int:
    """docs/cluster.md's figure: the CPUs a GPU's streamed run needs (its decoding and the trainer)."""
    (n,) = re.findall(r"needs \*\*(\d+) CPUs per GPU\*\*", (REPO / "docs" / "cluster.md").read_text())
    return int(n)


def _cpus(quantity: str) -> float:
    """A Kubernetes CPU quantity ("14", "500m") in CPUs."""
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


@pytest.mark.parametrize("file", ["raycluster.yaml", "rayjob.yaml"])
def test_gpu_workers_have_the_cpus_their_stream_decodes_on(file):
    """Each GPU worker pod asks for docs/cluster.md's CPUs per GPU or more (request and limit: the limit is the
    cgroup's quota the decode tasks share), and Ray is not told fewer; the RayJob's study lets that many
    decode tasks run (``data.stream_tasks``: all but the trainer's CPU)."""
    need = _documented_cpus_per_gpu()
    (doc,) = manifests(file)
    cluster = doc["spec"].get("rayClusterSpec", doc["spec"])
    groups = [g for g in cluster["workerGroupSpecs"]
              if g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")]
    assert groups
    for g in groups:
        resources = g["template"]["spec"]["containers"][0]["resources"]
        gpus = int(resources["limits"]["nvidia.com/gpu"])
        for kind in ("requests", "limits"):
            assert _cpus(resources[kind]["cpu"]) >= need * gpus, (file, g["groupName"], kind, resources[kind], need)
        if "num-cpus" in g["rayStartParams"]:
            assert float(g["rayStartParams"]["num-cpus"]) >= need * gpus, (file, g["rayStartParams"])
    if doc["kind"] == "RayJob":
        (tasks,) = re.findall(r"data\.stream_tasks=(\d+)", doc["spec"]["entrypoint"])
        assert int(tasks) >= need - 1, (tasks, need)


def test_the_job_submitter_has_the_token():
    """K8sJobMode: a Kubernetes Job runs `ray job submit` against the head's job API, which refuses a client
    without the token; the submitter's template gives it the same Secret's token."""
    spec = _job()["spec"]
    assert spec["submissionMode"] == "K8sJobMode"
    (c,) = spec["submitterPodTemplate"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    ref = env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == (spec["rayClusterSpec"]["authOptions"]["secretName"], "auth_token")
    assert spec["submitterPodTemplate"]["spec"]["restartPolicy"] == "Never"  # a Job's pods may not restart Always


class _Accepted(Exception):
    """Raised where the study, its input accepted, would start Ray."""


def _check_entrypoint(entrypoint: str, env: dict[str, str], monkeypatch) -> tuple[int | None, tuple | None]:
    """Run the study the entrypoint names, as the head would, up to the point where it starts Ray: the real
    argument parsing and the real config check (every trial's config built and validated)."""
    import mocolab.tune.sweep as sweep_module

    words = shlex.split(entrypoint)
    assert words[0] == "python" and (REPO / words[1]).is_file(), words[:2]
    script = (REPO / words[1]).read_text()
    assert "from mocolab.tune.studies.momentum import main" in script, "the test knows how to check only this study"
    from mocolab.tune.studies import momentum

    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def accepted(sweep, launch):
        raise _Accepted(sweep, launch)

    monkeypatch.setattr(sweep_module, "resolve_sweep", accepted)
    try:
        code = momentum.main(words[2:])
    except _Accepted as ok:
        return None, ok.args  # (sweep, launch)
    except SystemExit as exit_:
        return exit_.code, None
    return code, None


def _driver_env(job: dict) -> dict[str, str]:
    """What the entrypoint's process sees on the head: the head container's env and the job's runtime env."""
    (head,) = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in head["env"] if "value" in e}
    env.update(yaml.safe_load(job["spec"]["runtimeEnvYAML"])["env_vars"])
    return env


@pytest.fixture(scope="module")
def data_volume(tmp_path_factory) -> Iterator[Path]:
    """A folder standing in for the data volume: ImageNet's layout (training/ and val/ by class) with as many
    (empty) image files as the preset's queue needs, since the check counts them by a folder walk, as the
    head would on the volume. No image is decoded before the first trial.

    In memory (/dev/shm) where the machine has it: 70,000 files cost half a second there, and from 2 to 30 s
    on a shared disk."""
    shm = Path("/dev/shm")
    in_memory = shm.is_dir() and os.access(shm, os.W_OK)
    volume = Path(tempfile.mkdtemp(prefix="mocolab-volume-", dir=shm)) if in_memory \
        else tmp_path_factory.mktemp("data-volume")
    for split, n in (("train", 70_000), ("val", 10)):
        for c in range(10):
            folder = volume / "imagenet" / split / f"n{c:08d}"
            folder.mkdir(parents=True)
            for i in range(n // 10):
                os.close(os.open(f"{folder}/{i}.JPEG", os.O_CREAT | os.O_WRONLY, 0o644))
    yield volume
    shutil.rmtree(volume, ignore_errors=True)  # memory, or pytest's later cleanup at some test's expense


def _data_mount(job: dict) -> str:
    (head,) = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
    (mount,) = [m["mountPath"] for m in head["volumeMounts"] if m["name"] == "data"]
    return mount


def test_rayjob_entrypoint_passes_the_studys_own_config_check(monkeypatch, capsys, data_volume):
    job = _job()
    mount, volume = _data_mount(job), data_volume
    entrypoint = job["spec"]["entrypoint"]
    assert f"data.root={mount}/" in entrypoint, "the images must come from the data volume the pods mount"
    env = {k: v.replace(mount, str(volume)) for k, v in _driver_env(job).items()}
    code, accepted = _check_entrypoint(entrypoint.replace(f"={mount}/", f"={volume}/"), env, monkeypatch)
    assert code is None, f"the study refuses the RayJob's entrypoint: {capsys.readouterr().err}"
    sweep, launch = accepted
    assert sweep.preset == "imagenet-resnet50" and launch.storage.startswith("/shared/")
    assert launch.gpus_per_worker == 1 and launch.workers_per_trial == 2
    assert launch.tracking_uri is None and os.environ["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"


def test_the_config_check_refuses_what_the_cluster_would_refuse(monkeypatch, capsys, data_volume):
    """The check is the study's own: without the data folder, or with one that is not there, the study
    stops before its first trial."""
    job = _job()
    mount, volume = _data_mount(job), data_volume
    entrypoint = job["spec"]["entrypoint"]
    without = " ".join(w for w in shlex.split(entrypoint) if not w.startswith("data.root=")).replace(" --set ", " ")
    code, _ = _check_entrypoint(without, _driver_env(job), monkeypatch)
    assert code == 2 and "data.root: imagefolder needs a folder path" in capsys.readouterr().err
    code, _ = _check_entrypoint(entrypoint.replace(f"={mount}/", f"={volume}/missing-"), _driver_env(job), monkeypatch)
    assert code == 2 and "does not exist" in capsys.readouterr().err
