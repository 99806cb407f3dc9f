"""KubernetesJob without an API server (none can run here): every object it would create is
validated against the Kubernetes schemas (kubernetes-validate, strict: an unknown field
fails), and the pod side runs for real: each "pod" is a process in a network-namespace
host given the environment and command line the kubelet would make of the StatefulSet's
template and the job's Secret; the kubelet's readiness probe, the API's view of Ready
pods and a client attaching to their workers follow."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jobkit import drop_hosts, make_hosts, netns_of
from kubernetes import client

from monarch.core import SECRET_ENV
from monarch.core.testing import wait_until
from monarch.job import JobError, SlurmJob, job_backend, job_loads
from monarch.job._kubernetes import RANK_LABEL, ready_workers, serialize
from monarch.job.kubernetes import ImageSpec, KubeConfig, KubernetesJob
from monarch.job.spmd import serve

HERE = Path(__file__).parent
VERSIONS = ["1.28", kubernetes_validate.latest_version()]
"""The oldest release that labels a StatefulSet's pods with their index, and the newest."""


def validate(obj: Any) -> dict[str, Any]:
    """The object as it is sent, checked against every version's schema."""
    data = serialize(obj)
    for version in VERSIONS:
        kubernetes_validate.validate(data, version, strict=True)
    return data


def full_job() -> KubernetesJob:
    job = KubernetesJob("research", timeout=60)
    job.add_mesh(
        "trainers",
        4,
        image_spec=ImageSpec(
            "ghcr.io/example/monarch:1",
            resources={"cpu": 4, "memory": "16Gi", "nvidia.com/gpu": 8},
            enable_fuse=True,
            shared_memory_size="8Gi",
        ),
        labels={"team": "ml"},
        annotations={"example.com/owner": "alice"},
    )
    extra = client.V1Container(
        name="main",
        image="ghcr.io/example/custom:2",
        env=[client.V1EnvVar(name="NCCL_DEBUG", value="INFO")],
        volume_mounts=[client.V1VolumeMount(name="data", mount_path="/data")],
    )
    template = client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels={"tier": "gen"}),
        spec=client.V1PodSpec(
            containers=[extra],
            volumes=[client.V1Volume(name="data", empty_dir=client.V1EmptyDirVolumeSource())],
        ),
    )
    job.add_mesh("generators", 2, pod_template=template, port=27000)
    job.add_mesh("existing", 3)  # pods that run already: nothing is created for it
    return job


def test_every_object_the_job_creates_is_valid_kubernetes() -> None:
    job = full_job()
    objects = [validate(obj) for obj in job.manifests()]
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    ident = job._id
    assert kinds == [
        ("Secret", f"monarch-{ident}"),
        ("Service", f"trainers-{ident}"),
        ("StatefulSet", f"trainers-{ident}"),
        ("Service", f"generators-{ident}"),
        ("StatefulSet", f"generators-{ident}"),
    ]
    secret, _, trainers, service, generators = objects
    # The secret is in the Secret only; the worker gets it by reference.
    hexed = job._secret.hex()
    assert secret["stringData"] == {"secret": hexed}
    assert hexed not in json.dumps(objects[1:])
    for sts in (trainers, generators):
        spec = sts["spec"]
        assert spec["podManagementPolicy"] == "Parallel"
        pod = spec["template"]
        labels = pod["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items()
        worker = pod["spec"]["containers"][0]
        env = {var["name"]: var for var in worker["env"]}
        ref = env[SECRET_ENV]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": f"monarch-{ident}", "key": "secret"}
        assert env["MONARCH_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert worker["readinessProbe"]["tcpSocket"]["port"] == "monarch"
        assert len(sts["metadata"]["name"]) <= 52  # its pods' revision label fits in 63
    assert trainers["metadata"]["labels"]["team"] == "ml"
    assert trainers["metadata"]["annotations"] == {"example.com/owner": "alice"}
    container = trainers["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "8"}
    assert container["securityContext"] == {"privileged": True}
    # The template's own container, labels and volumes are kept; the worker's are added.
    gen_pod = generators["spec"]["template"]
    assert gen_pod["metadata"]["labels"]["tier"] == "gen"
    gen = gen_pod["spec"]["containers"][0]
    assert gen["image"] == "ghcr.io/example/custom:2"
    assert gen["command"][:2] == ["monarch", "worker"]
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in gen["env"]
    assert gen["ports"] == [{"containerPort": 27000, "name": "monarch"}]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "monarch", "port": 27000}]


def test_the_schema_check_catches_a_wrong_field() -> None:
    """So that the tests above would fail on one (a snake_case key, as a model's to_dict
    gives, is no field of the API)."""
    job = KubernetesJob("default")
    job.add_mesh("hosts", 1, image_spec=ImageSpec("image"))
    sts = serialize(job.manifests()[-1])
    kubernetes_validate.validate(sts, VERSIONS[-1], strict=True)
    sts["spec"]["service_name"] = sts["spec"].pop("serviceName")
    with pytest.raises(kubernetes_validate.ValidationError, match="service_name"):
        kubernetes_validate.validate(sts, VERSIONS[-1], strict=True)


names = st.from_regex(r"[a-z][a-z0-9]{0,42}", fullmatch=True)
quantities = st.one_of(
    st.integers(1, 512), st.from_regex(r"[1-9][0-9]{0,3}(Mi|Gi)", fullmatch=True)
)


@settings(max_examples=30, deadline=None)
@given(
    meshes=st.dictionaries(names, st.integers(1, 64), min_size=1, max_size=3),
    resources=st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), quantities),
    port=st.integers(1, 65535),
    shm=st.one_of(st.none(), st.from_regex(r"[1-9][0-9]{0,2}Gi", fullmatch=True)),
    fuse=st.booleans(),
)
def test_any_job_s_objects_are_valid(
    meshes: dict[str, int], resources: dict[str, Any], port: int, shm: str | None, fuse: bool
) -> None:
    job = KubernetesJob("ns1")
    spec = ImageSpec("registry/image:tag", resources, fuse, shm)
    for name, replicas in meshes.items():
        job.add_mesh(name, replicas, image_spec=spec, port=port)
    objects = [validate(obj) for obj in job.manifests()]
    assert len(objects) == 1 + 2 * len(meshes)
    for sts in objects[2::2]:
        mesh = sts["metadata"]["labels"]["monarch.pytorch.org/mesh-name"]
        assert sts["spec"]["replicas"] == meshes[mesh]


def test_bad_meshes_are_refused_clearly() -> None:
    job = KubernetesJob("default")
    for name, says in (
        ("", "non-empty"),
        ("Trainers", "lowercase"),
        ("my-mesh", "lowercase letters and digits"),
        ("1mesh", "starting with a letter"),
        ("a" * 44, "at most 43"),
    ):
        with pytest.raises(ValueError, match=says):
            job.add_mesh(name, 1)
    with pytest.raises(ValueError, match="num_replicas must be >= 1"):
        job.add_mesh("hosts", 0)
    with pytest.raises(ValueError, match="mutually exclusive"):
        job.add_mesh("hosts", 1, image_spec=ImageSpec("i"), pod_template=client.V1PodTemplateSpec())
    with pytest.raises(ValueError, match="'label_selector' cannot be set when provisioning"):
        job.add_mesh("hosts", 1, image_spec=ImageSpec("i"), label_selector="a=b")
    with pytest.raises(ValueError, match="only be set when provisioning"):
        job.add_mesh("hosts", 1, labels={"a": "b"})
    empty = client.V1PodTemplateSpec(spec=client.V1PodSpec(containers=[]))
    with pytest.raises(ValueError, match="needs a container"):
        job.add_mesh("hosts", 1, pod_template=empty)
    with pytest.raises(ValueError, match="port number"):
        job.add_mesh("hosts", 1, port=0)
    with pytest.raises(ValueError, match="RFC 1123"):
        KubernetesJob("My_Namespace")
    job.add_mesh("hosts", 1)
    with pytest.raises(ValueError, match="added already"):
        job.add_mesh("hosts", 2)
    with pytest.raises(JobError, match="needs a mesh"):
        KubernetesJob("default").apply()


def test_an_api_server_that_cannot_be_reached_or_configured_is_a_job_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    job = KubernetesJob("default", kubeconfig=KubeConfig.from_path(str(kubeconfig)))
    job.add_mesh("hosts", 1, image_spec=ImageSpec("image"))
    with pytest.raises(JobError, match=r"creating Secret monarch-.*cannot be reached"):
        job.apply()
    missing = KubernetesJob("default", kubeconfig=KubeConfig.from_path(str(tmp_path / "none")))
    missing.add_mesh("hosts", 1, image_spec=ImageSpec("image"))
    with pytest.raises(JobError, match="cannot load the kubeconfig"):
        missing.apply()
    here = KubernetesJob("default")  # in-cluster configuration, outside a cluster
    here.add_mesh("hosts", 1, image_spec=ImageSpec("image"))
    with pytest.raises(JobError, match=r"in-cluster configuration.*KubeConfig\.from_path"):
        here.apply()


def test_a_saved_job_is_the_same_job() -> None:
    job = full_job()
    job.manifests()
    loaded = job_loads(job.dumps())
    assert isinstance(loaded, KubernetesJob)
    assert loaded.can_run(full_job()) and loaded._secret == job._secret
    assert [serialize(o) for o in loaded.manifests()] == [serialize(o) for o in job.manifests()]
    other = full_job()
    other.add_mesh("more", 1, image_spec=ImageSpec("image"))
    assert not loaded.can_run(other)


def test_serve_runs_a_torchrun_line_on_a_mesh_of_pods() -> None:
    line = ["torchrun", "--nnodes=3", "--nproc-per-node=8", "train.py", "--lr", "0.1"]
    cfg = {"namespace": "ml", "timeout": 600, "image_spec": ImageSpec("image:1")}
    spmd = serve(line, scheduler="kubernetes", scheduler_cfg=cfg)
    job = spmd._job
    assert isinstance(job, KubernetesJob) and job._timeout == 600
    sts = [validate(obj) for obj in job.manifests()][-1]
    assert sts["kind"] == "StatefulSet" and sts["spec"]["replicas"] == 3
    assert sts["metadata"]["namespace"] == "ml"
    assert spmd.torchrun.script_args == ("train.py", "--lr", "0.1")
    with pytest.raises(ValueError, match="namespace"):
        serve(line, scheduler="kubernetes", scheduler_cfg={"image_spec": ImageSpec("i")})


def test_kubernetes_is_a_job_backend() -> None:
    found = {ep.name for ep in entry_points(group="monarch.job_backends")}
    assert {"local", "process", "slurm", "ssh", "kubernetes"} <= found
    assert job_backend("kubernetes") is KubernetesJob
    assert job_backend("slurm") is SlurmJob
    with pytest.raises(LookupError, match=r"no job backend 'mast'.*installed: .*kubernetes"):
        job_backend("mast")


# -- the API's view of pods: which are the mesh's hosts, and when all are Ready -----------------


def pod(rank: int | None, ip: str | None, ready: bool, waiting: str | None = None) -> Any:
    labels = {} if rank is None else {RANK_LABEL: str(rank)}
    state = None
    if waiting is not None:
        state = client.V1ContainerState(waiting=client.V1ContainerStateWaiting(reason=waiting))
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=f"hosts-{rank}", labels=labels),
        status=client.V1PodStatus(
            phase="Running" if ready else "Pending",
            pod_ip=ip,
            conditions=[client.V1PodCondition(type="Ready", status=str(ready))],
            container_statuses=[
                client.V1ContainerStatus(
                    name="worker", image="i", image_id="", ready=ready, restart_count=0, state=state
                )
            ],
        ),
    )


@given(st.permutations(range(5)), st.lists(st.integers(5, 9), max_size=3))
def test_ready_pods_are_ordered_by_rank_whatever_the_api_s_order(
    order: list[int], strays: list[int]
) -> None:
    pods = [pod(rank, f"10.1.0.{rank}", True) for rank in order]
    pods += [pod(rank, "10.9.9.9", True) for rank in strays]  # outside the mesh: ignored
    pods.append(pod(None, "10.9.9.8", True))  # no rank label: not a host of the mesh
    addresses, waiting = ready_workers(pods, 5, RANK_LABEL, 26600)
    assert addresses == [f"tcp://10.1.0.{rank}:26600" for rank in range(5)] and waiting == []


def test_a_mesh_waits_for_every_rank_and_says_on_what() -> None:
    pods = [
        pod(0, "10.1.0.1", True),
        pod(1, None, False, waiting="ImagePullBackOff"),
        pod(3, "fd00::3", True),
    ]
    addresses, waiting = ready_workers(pods, 4, RANK_LABEL, 26600)
    assert addresses is None
    assert waiting == ["pod hosts-1 is Pending: ImagePullBackOff", "rank 2: no pod yet"]
    pods[1] = pod(1, "10.1.0.2", True)
    pods.append(pod(2, "10.1.0.3", True))
    addresses, _ = ready_workers(pods, 4, RANK_LABEL, 26600)
    assert addresses is not None and addresses[3] == "tcp://[fd00::3]:26600"  # IPv6


# -- the pod side, for real -----------------------------------------------------------------


def kubelet_env(container: dict[str, Any], secret: dict[str, Any], pod_ip: str) -> dict[str, str]:
    """The container's environment as the kubelet makes it (a literal value, a field of
    the pod from the downward API, a key of a Secret), on a pod's base environment."""
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": "/root"}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "fieldRef" in var["valueFrom"]:
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
            env[var["name"]] = pod_ip
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"]
            env[var["name"]] = secret["stringData"][ref["key"]]
    return env


def expand(argv: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' ``$(VAR)`` expansion of a container's command and args."""
    var = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
    return [var.sub(lambda m: env.get(m[1], m[0]), arg) for arg in argv]


@pytest.fixture
def hosts() -> Iterator[list[str]]:
    """h1 (the client) and h2, h3 (the pods). Where they cannot be made (not root, no
    iproute2) the test fails saying so."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.fail("the pod test needs root and iproute2 (network namespaces)")
    prefix = f"mk{os.getpid() % 100000}"
    try:
        yield make_hosts(3, prefix)
    finally:
        drop_hosts(prefix)


def probe(host: str, ip: str, port: int) -> bool:
    """The kubelet's TCP readiness probe: a connection that is accepted, then closed."""
    code = f"import socket; socket.create_connection(({ip!r}, {port}), timeout=2).close()"
    argv = ["ip", "netns", "exec", host, sys.executable, "-c", code]
    return subprocess.run(argv, capture_output=True).returncode == 0


def test_pods_run_the_worker_from_the_manifests_and_a_client_attaches(
    hosts: list[str], tmp_path: Path
) -> None:
    job = KubernetesJob("default")
    job.add_mesh("hosts", 2, image_spec=ImageSpec("image"))
    secret, _, sts = (serialize(obj) for obj in job.manifests())
    template = sts["spec"]["template"]
    container = template["spec"]["containers"][0]
    ip_command = shutil.which("ip")
    assert ip_command is not None
    pods: list[subprocess.Popen[str]] = []
    try:
        api_view = []
        for rank, host in enumerate(hosts[1:]):
            pod_ip = f"10.0.0.{rank + 2}"
            env = kubelet_env(container, secret, pod_ip)
            argv = expand([*container.get("command", []), *container.get("args", [])], env)
            pods.append(
                subprocess.Popen(
                    [ip_command, "netns", "exec", host, *argv],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            port = container["ports"][0]["containerPort"]
            wait_until(partial(probe, host, pod_ip, port), 60, f"pod {rank} is Ready")
            assert pods[-1].stdout is not None
            assert pods[-1].stdout.readline().strip() == f"tcp://{pod_ip}:{port}"
            labels = {**template["metadata"]["labels"], RANK_LABEL: str(rank)}
            api_view.append(
                client.V1Pod(
                    metadata=client.V1ObjectMeta(
                        name=f"{sts['metadata']['name']}-{rank}", labels=labels
                    ),
                    status=client.V1PodStatus(
                        pod_ip=pod_ip,
                        conditions=[client.V1PodCondition(type="Ready", status="True")],
                    ),
                )
            )
        # The secret is on no command line; the probes did the workers no harm.
        for worker in pods:
            cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes()
            assert job._secret.hex().encode() not in cmdline
        port = container["ports"][0]["containerPort"]
        addresses, _ = ready_workers(api_view, 2, RANK_LABEL, port)
        assert addresses == ["tcp://10.0.0.2:26600", "tcp://10.0.0.3:26600"]
        client_env = {**os.environ, SECRET_ENV: job._secret.hex()}
        done = subprocess.run(
            [*in_host(hosts[0]), sys.executable, str(HERE / "attach_script.py"), *addresses],
            env=client_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        nets = json.loads(done.stdout.strip().splitlines()[-1])
        assert nets == [netns_of(host) for host in hosts[1:]]
        for worker in pods:  # a pod's deletion: SIGTERM to its process
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(30) == 0
    finally:
        for worker in pods:
            if worker.poll() is None:
                worker.kill()
            worker.communicate(timeout=10)


def in_host(host: str) -> list[str]:
    return ["ip", "netns", "exec", host]
