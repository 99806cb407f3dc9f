"""``KubernetesJob``: host meshes of pods, made and found through the official
``kubernetes`` client.

A provisioned mesh (``add_mesh(name, n, image_spec=ImageSpec(image, resources))``) is a
StatefulSet of ``n`` pods, started in parallel, behind a headless Service. Each pod runs
``monarch worker`` listening on its pod IP (from the downward API); the job secret comes
from a Secret the job creates, into the worker's environment by a ``secretKeyRef``: it
is on no command line and in no object but the Secret. A pod is Ready once its worker
accepts connections (a TCP probe on the worker's port). The client, which must reach the
pod IPs (it runs in the cluster), waits until every rank's pod is Ready, orders them by
their pod-index label and attaches to their workers. A mesh given neither ``image_spec``
nor ``pod_template`` attaches to pods that exist already (``label_selector``), whose
workers share this client's secret (``MONARCH_JOB_SECRET`` in both environments).
``kill()`` deletes what the job created.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import secrets
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from monarch.core import install_hint

try:
    import urllib3
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException
except ImportError:  # as upstream's: the module needs the client
    raise RuntimeError(
        "please install kubernetes to use KubernetesJob: "
        + install_hint("monarch-jobs", "kubernetes")
    ) from None

from monarch.core import SECRET_ENV, job_secret

from ._state import JobState, attached_state
from ._trait import JobError, JobTrait, no_batch_mode

DEFAULT_PORT: Final = 26600
"""The worker's port in a pod (upstream's)."""
RANK_LABEL: Final = "apps.kubernetes.io/pod-index"
"""The label a StatefulSet gives each pod: its ordinal, the host's rank in the mesh."""
APP_LABEL: Final = "app.kubernetes.io/name"
WORKER_APP: Final = "monarch-worker"
MESH_LABEL: Final = "monarch.pytorch.org/mesh-name"
JOB_LABEL: Final = "monarch.pytorch.org/job"
SECRET_KEY: Final = "secret"
POD_IP_ENV: Final = "MONARCH_POD_IP"
PORT_ENV: Final = "MONARCH_PORT"
WORKER_COMMAND: Final = (
    "monarch",
    "worker",
    "--listen",
    f"tcp://$({POD_IP_ENV}):$({PORT_ENV})@tcp://0.0.0.0:$({PORT_ENV})",
)
"""What a provisioned pod runs (Kubernetes expands ``$(VAR)`` from the container's
environment): listening on every interface, known by its pod IP."""
MAX_MESH_NAME: Final = 43
"""A StatefulSet's name (``<mesh>-<job id>``) must leave room in the 63 characters of the
label Kubernetes derives from it (``controller-revision-hash``: name, dash, 10)."""
_DNS_LABEL: Final = re.compile(r"[a-z]([a-z0-9]*[a-z0-9])?")
POLL: Final = 0.5
"""Seconds between looks at a mesh's pods while they start."""


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """The container image of a provisioned mesh's pods (upstream's): ``resources`` are
    its requests and limits (``{"cpu": 4, "nvidia.com/gpu": 8}``); ``enable_fuse`` runs
    it privileged with the node's ``/dev/fuse``; ``shared_memory_size`` mounts a
    memory-backed ``/dev/shm`` of that size (for NCCL)."""

    image: str
    resources: Mapping[str, str | int] | None = None
    enable_fuse: bool = False
    shared_memory_size: str | None = None


@dataclasses.dataclass(frozen=True)
class KubeConfig:
    """How the client reaches the API server (upstream's): a kubeconfig file
    (``from_path``), a ``kubernetes.client.Configuration`` (``from_config``; not saved
    with the job), else the in-cluster service account."""

    local: Path | None = None
    remote: Any = None

    @classmethod
    def from_path(cls, path: str) -> KubeConfig:
        return cls(local=Path(path).expanduser())

    @classmethod
    def from_config(cls, configuration: Any) -> KubeConfig:
        return cls(remote=configuration)

    @property
    def out_of_cluster(self) -> bool:
        return self.local is not None or self.remote is not None

    def __getstate__(self) -> dict[str, Any]:
        # A Configuration is the process's own (credentials, sockets): not saved.
        return {"local": self.local, "remote": "unsaved" if self.remote is not None else None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "local", state["local"])
        object.__setattr__(self, "remote", state["remote"])

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this configuration."""
        try:
            if self.remote == "unsaved":
                raise JobError(
                    "this job was saved without its in-memory Kubernetes configuration "
                    "(KubeConfig.from_config): state() on a KubernetesJob given it again "
                    "re-attaches; KubeConfig.from_path() is saved with the job"
                )
            if self.remote is not None:
                return client.ApiClient(self.remote)
            if self.local is not None:
                return config.new_client_from_config(config_file=str(self.local))
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        except config.ConfigException as exc:
            where = f"kubeconfig {self.local}" if self.local else "in-cluster configuration"
            raise JobError(
                f"cannot load the {where}: {exc} (outside a cluster, pass "
                "kubeconfig=KubeConfig.from_path(...))"
            ) from None


@dataclasses.dataclass(frozen=True)
class _Mesh:
    name: str
    replicas: int
    selector: str
    rank_label: str
    port: int
    image_spec: ImageSpec | None
    template: dict[str, Any] | None
    """A ``pod_template`` given, as the API's JSON (saved and compared with the job)."""
    labels: Mapping[str, str] | None
    annotations: Mapping[str, str] | None

    @property
    def provisioned(self) -> bool:
        return self.image_spec is not None or self.template is not None


class KubernetesJob(JobTrait):
    """Host meshes of pods in ``namespace`` (upstream's arguments): each ``add_mesh``
    makes a StatefulSet (``image_spec`` or ``pod_template``) or finds pods that run
    already (``label_selector``). ``timeout``: seconds for a mesh's pods to be Ready
    (None: no limit)."""

    def __init__(
        self,
        namespace: str,
        timeout: int | None = None,
        kubeconfig: KubeConfig | None = None,
    ) -> None:
        super().__init__()
        if type(namespace) is not str or not _DNS_LABEL.fullmatch(namespace):
            raise ValueError(f"namespace: a Kubernetes name (RFC 1123 label), not {namespace!r}")
        self._namespace = namespace
        self._timeout = timeout
        self._kubeconfig = kubeconfig or KubeConfig()
        self._meshes: dict[str, _Mesh] = {}
        self._id = job_id()
        self._secret = b""

    def add_mesh(
        self,
        name: str,
        num_replicas: int,
        label_selector: str | None = None,
        pod_rank_label: str = RANK_LABEL,
        image_spec: ImageSpec | None = None,
        port: int = DEFAULT_PORT,
        pod_template: Any = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """A mesh ``name`` of ``num_replicas`` hosts (pods), its ranks 0..n-1 read from
        ``pod_rank_label``. Provisioned with ``image_spec`` (an ``ImageSpec``) or
        ``pod_template`` (a ``kubernetes.client.V1PodTemplateSpec``; its first container
        runs the worker and gets its environment, and its command where it has none);
        ``labels``/``annotations`` go on the objects the job makes. Without either, the
        pods matching ``label_selector`` (default: upstream's worker labels for ``name``)
        are the hosts."""
        check_mesh_name(name)
        if name in self._meshes:
            raise ValueError(f"mesh {name!r} is added already")
        if type(num_replicas) is not int or num_replicas < 1:
            raise ValueError(f"mesh {name!r}: num_replicas must be >= 1, not {num_replicas!r}")
        if type(port) is not int or not 0 < port < 65536:
            raise ValueError(f"mesh {name!r}: port must be a port number, not {port!r}")
        if image_spec is not None and pod_template is not None:
            raise ValueError("'image_spec' and 'pod_template' are mutually exclusive")
        if image_spec is not None and not isinstance(image_spec, ImageSpec):
            raise TypeError(f"image_spec: an ImageSpec, not {type(image_spec).__name__}")
        provisioned = image_spec is not None or pod_template is not None
        if provisioned and label_selector is not None:
            raise ValueError("'label_selector' cannot be set when provisioning (the job's own)")
        if provisioned and pod_rank_label != RANK_LABEL:
            raise ValueError("'pod_rank_label' cannot be set when provisioning (a StatefulSet's)")
        if not provisioned and (labels is not None or annotations is not None):
            raise ValueError("'labels' and 'annotations' can only be set when provisioning")
        template = None
        if pod_template is not None:
            if not isinstance(pod_template, client.V1PodTemplateSpec):
                raise TypeError("pod_template: a kubernetes.client.V1PodTemplateSpec")
            template = serialize(pod_template)
            if not template.get("spec", {}).get("containers"):
                raise ValueError("pod_template: its spec needs a container (the worker's)")
        for key, value in {**(labels or {}), **(annotations or {})}.items():
            if type(key) is not str or type(value) is not str:
                raise TypeError(f"labels and annotations: strings, not {key!r}: {value!r}")
        selector = label_selector or f"{APP_LABEL}={WORKER_APP},{MESH_LABEL}={name}"
        if provisioned:
            selector = f"{selector},{JOB_LABEL}={self._id}"
        self._meshes[name] = _Mesh(
            name,
            num_replicas,
            selector,
            pod_rank_label,
            port,
            image_spec,
            template,
            dict(labels) if labels is not None else None,
            dict(annotations) if annotations is not None else None,
        )

    # -- the objects a provisioned job makes -------------------------------------------------

    def manifests(self) -> list[Any]:
        """The objects ``apply()`` creates, as the client's models: the job's Secret,
        then a headless Service and a StatefulSet per provisioned mesh."""
        if not self._secret:
            self._secret = job_secret()
        provisioned = [mesh for mesh in self._meshes.values() if mesh.provisioned]
        if not provisioned:
            return []
        objects: list[Any] = [self._secret_object()]
        for mesh in provisioned:
            objects += [self._service(mesh), self._stateful_set(mesh)]
        return objects

    def _name(self, mesh: str) -> str:
        return f"{mesh}-{self._id}"

    def _metadata(
        self, name: str, mesh: _Mesh | None = None, labels: Mapping[str, str] | None = None
    ) -> Any:
        merged = {APP_LABEL: WORKER_APP, JOB_LABEL: self._id}
        if mesh is not None:
            merged = {**(mesh.labels or {}), **merged, MESH_LABEL: mesh.name}
        merged.update(labels or {})
        annotations = dict(mesh.annotations) if mesh and mesh.annotations else None
        return client.V1ObjectMeta(
            name=name, namespace=self._namespace, labels=merged, annotations=annotations
        )

    def _secret_object(self) -> Any:
        return client.V1Secret(
            api_version="v1",
            kind="Secret",
            metadata=self._metadata(f"monarch-{self._id}"),
            type="Opaque",
            string_data={SECRET_KEY: self._secret.hex()},
        )

    def _pod_labels(self, mesh: _Mesh) -> dict[str, str]:
        return {APP_LABEL: WORKER_APP, MESH_LABEL: mesh.name, JOB_LABEL: self._id}

    def _service(self, mesh: _Mesh) -> Any:
        """Headless: the pods' stable names (``<pod>.<service>``), no load balancing."""
        return client.V1Service(
            api_version="v1",
            kind="Service",
            metadata=self._metadata(self._name(mesh.name), mesh),
            spec=client.V1ServiceSpec(
                cluster_ip="None",
                selector=self._pod_labels(mesh),
                publish_not_ready_addresses=True,
                ports=[client.V1ServicePort(name="monarch", port=mesh.port)],
            ),
        )

    def _stateful_set(self, mesh: _Mesh) -> Any:
        name = self._name(mesh.name)
        return client.V1StatefulSet(
            api_version="apps/v1",
            kind="StatefulSet",
            metadata=self._metadata(name, mesh),
            spec=client.V1StatefulSetSpec(
                replicas=mesh.replicas,
                service_name=name,
                pod_management_policy="Parallel",  # every host at once, not one by one
                selector=client.V1LabelSelector(match_labels=self._pod_labels(mesh)),
                template=self._pod_template(mesh),
            ),
        )

    def _pod_template(self, mesh: _Mesh) -> Any:
        if mesh.template is not None:
            template = _deserialize(mesh.template, "V1PodTemplateSpec")
        else:
            assert mesh.image_spec is not None
            template = _image_template(mesh.image_spec)
        metadata = template.metadata or client.V1ObjectMeta()
        metadata.labels = {**(metadata.labels or {}), **self._pod_labels(mesh)}
        template.metadata = metadata
        worker = template.spec.containers[0]
        if not worker.command:
            worker.command = list(WORKER_COMMAND)
        ours = self._worker_env(mesh)
        names = {var.name for var in ours}
        worker.env = [*ours, *(var for var in worker.env or () if var.name not in names)]
        port = client.V1ContainerPort(name="monarch", container_port=mesh.port)
        worker.ports = [port, *(p for p in worker.ports or () if p.container_port != mesh.port)]
        if worker.readiness_probe is None:  # Ready: the worker accepts connections
            worker.readiness_probe = client.V1Probe(
                tcp_socket=client.V1TCPSocketAction(port="monarch"),
                period_seconds=2,
            )
        return template

    def _worker_env(self, mesh: _Mesh) -> list[Any]:
        pod_ip = client.V1ObjectFieldSelector(field_path="status.podIP")
        secret = client.V1SecretKeySelector(name=f"monarch-{self._id}", key=SECRET_KEY)
        return [
            client.V1EnvVar(name=POD_IP_ENV, value_from=client.V1EnvVarSource(field_ref=pod_ip)),
            client.V1EnvVar(name=PORT_ENV, value=str(mesh.port)),
            client.V1EnvVar(
                name=SECRET_ENV, value_from=client.V1EnvVarSource(secret_key_ref=secret)
            ),
        ]

    # -- JobTrait --------------------------------------------------------------------------

    def _spec(self) -> object:
        meshes = [json.dumps(_mesh_spec(mesh), sort_keys=True) for mesh in self._meshes.values()]
        return self._namespace, sorted(meshes)

    def _create(self, client_script: str | None) -> None:
        no_batch_mode(self, client_script)
        if not self._meshes:
            raise JobError("a KubernetesJob needs a mesh: call add_mesh(...) first")
        objects = self.manifests()
        if not objects:
            return  # every mesh is pods that run already
        api = self._kubeconfig.api_client()
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        create = {
            "Secret": core.create_namespaced_secret,
            "Service": core.create_namespaced_service,
            "StatefulSet": apps.create_namespaced_stateful_set,
        }
        try:
            for obj in objects:
                _call(
                    f"creating {obj.kind} {obj.metadata.name}",
                    lambda obj=obj: create[obj.kind](self._namespace, obj),
                    self._namespace,
                )
        except BaseException:
            try:  # what was made of it
                self._kill()
            except JobError as exc:
                print(f"Could not delete what was made of the job: {exc}", file=sys.stderr)
            raise

    def _state(self) -> JobState:
        api = self._kubeconfig.api_client()
        core = client.CoreV1Api(api)
        addresses = {}
        for mesh in self._meshes.values():
            addresses[mesh.name] = self._wait_ready(core, mesh)
        return attached_state(self._secret, addresses)

    def _pods(self, core: Any, mesh: _Mesh) -> list[Any]:
        found = _call(
            f"listing the pods of mesh {mesh.name!r} ({mesh.selector})",
            lambda: core.list_namespaced_pod(self._namespace, label_selector=mesh.selector),
            self._namespace,
        )
        return list(found.items)

    def _wait_ready(self, core: Any, mesh: _Mesh) -> list[str]:
        """The workers' addresses by rank, once every rank's pod is Ready."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            addresses, waiting = ready_workers(
                self._pods(core, mesh), mesh.replicas, mesh.rank_label, mesh.port
            )
            if addresses is not None:
                return addresses
            if deadline is not None and time.monotonic() > deadline:
                raise JobError(
                    f"mesh {mesh.name!r}: not every pod was Ready within {self._timeout}s "
                    f"(namespace {self._namespace}): {'; '.join(waiting)}"
                )
            time.sleep(POLL)

    def _is_running(self) -> bool:
        core = client.CoreV1Api(self._kubeconfig.api_client())
        for mesh in self._meshes.values():
            addresses, _ = ready_workers(
                self._pods(core, mesh), mesh.replicas, mesh.rank_label, mesh.port
            )
            if addresses is None:
                return False
        return True

    def _kill(self) -> None:
        provisioned = [mesh for mesh in self._meshes.values() if mesh.provisioned]
        if not provisioned:
            return
        api = self._kubeconfig.api_client()
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        deletes = []
        for mesh in provisioned:
            name = self._name(mesh.name)
            deletes += [
                ("StatefulSet", name, apps.delete_namespaced_stateful_set),
                ("Service", name, core.delete_namespaced_service),
            ]
        deletes.append(("Secret", f"monarch-{self._id}", core.delete_namespaced_secret))
        for kind, name, delete in deletes:
            _call(
                f"deleting {kind} {name}",
                lambda name=name, delete=delete: delete(
                    name, self._namespace, propagation_policy="Background"
                ),
                self._namespace,
                missing_ok=True,
            )


def job_id() -> str:
    """8 characters that name one job's objects (a DNS label's: starts with a letter)."""
    return "j" + secrets.token_hex(4)[1:]


def check_mesh_name(name: str) -> None:
    """Upstream's rule (RFC 1123 label, lowercase letters and digits, starting with a
    letter), and short enough for the objects named after it."""
    if type(name) is not str or not name:
        raise ValueError(f"mesh name: a non-empty string, not {name!r}")
    if not name.isalnum() or not name.islower() or not name.isascii() or not name[0].isalpha():
        raise ValueError(
            f"mesh name {name!r} is invalid: lowercase letters and digits, starting with a letter"
        )
    if len(name) > MAX_MESH_NAME:
        raise ValueError(
            f"mesh name {name!r} is invalid: at most {MAX_MESH_NAME} characters "
            "(Kubernetes names are made of it)"
        )


def ready_workers(
    pods: Sequence[Any], replicas: int, rank_label: str, port: int
) -> tuple[list[str] | None, list[str]]:
    """The workers' addresses by rank when the pods (``V1Pod``s, as the API lists them)
    hold a Ready pod for every rank 0..replicas-1; else None and what each rank waits on."""
    ready: dict[int, str] = {}
    seen: dict[int, str] = {}
    for pod in pods:
        labels = pod.metadata.labels or {}
        try:
            rank = int(labels[rank_label])
        except (KeyError, ValueError):
            continue  # not one of the mesh's ranks
        if not 0 <= rank < replicas or pod.metadata.deletion_timestamp is not None:
            continue
        status = pod.status
        conditions = {c.type: c.status for c in (status.conditions or []) if status}
        if status is not None and status.pod_ip and conditions.get("Ready") == "True":
            host = f"[{status.pod_ip}]" if ":" in status.pod_ip else status.pod_ip
            ready[rank] = f"tcp://{host}:{port}"
        else:
            seen[rank] = f"pod {pod.metadata.name} {_waiting_on(pod)}"
    if len(ready) == replicas:
        return [ready[rank] for rank in range(replicas)], []
    waiting = [
        seen.get(rank, f"rank {rank}: no pod yet") for rank in range(replicas) if rank not in ready
    ]
    return None, waiting


def _waiting_on(pod: Any) -> str:
    """Why a pod is not Ready, as ``kubectl get pods`` would say (phase, container state)."""
    status = pod.status
    if status is None:
        return "has no status yet"
    for container in status.container_statuses or []:
        state = container.state
        if state is not None and state.waiting is not None:
            waiting = state.waiting
            return f"is {status.phase}: {waiting.reason} {waiting.message or ''}".strip()
        if state is not None and state.terminated is not None:
            term = state.terminated
            return f"is {status.phase}: its worker exited ({term.exit_code}, {term.reason})"
    return f"is {status.phase}, not Ready"


def _image_template(spec: ImageSpec) -> Any:
    """The pod of an ``ImageSpec``: one container running the worker (upstream's)."""
    resources = None
    if spec.resources:
        amounts = {str(k): str(v) for k, v in spec.resources.items()}
        resources = client.V1ResourceRequirements(requests=amounts, limits=dict(amounts))
    mounts, volumes, security = [], [], None
    if spec.enable_fuse:
        security = client.V1SecurityContext(privileged=True)
        mounts.append(client.V1VolumeMount(name="dev-fuse", mount_path="/dev/fuse"))
        volumes.append(
            client.V1Volume(
                name="dev-fuse",
                host_path=client.V1HostPathVolumeSource(path="/dev/fuse", type="CharDevice"),
            )
        )
    if spec.shared_memory_size is not None:
        mounts.append(client.V1VolumeMount(name="dev-shm", mount_path="/dev/shm"))
        volumes.append(
            client.V1Volume(
                name="dev-shm",
                empty_dir=client.V1EmptyDirVolumeSource(
                    medium="Memory", size_limit=spec.shared_memory_size
                ),
            )
        )
    container = client.V1Container(
        name="worker",
        image=spec.image,
        resources=resources,
        security_context=security,
        volume_mounts=mounts or None,
    )
    return client.V1PodTemplateSpec(
        spec=client.V1PodSpec(containers=[container], volumes=volumes or None)
    )


def _mesh_spec(mesh: _Mesh) -> dict[str, Any]:
    """What a mesh asks for, as JSON-able data (compared between a saved job and a new)."""
    spec = dataclasses.asdict(mesh)
    if mesh.image_spec is not None:
        spec["image_spec"] = dataclasses.asdict(mesh.image_spec)
        spec["image_spec"]["resources"] = dict(mesh.image_spec.resources or {})
    spec["selector"] = mesh.selector.rpartition(f",{JOB_LABEL}=")[0] or mesh.selector
    return spec


def serialize(obj: Any) -> dict[str, Any]:
    """A model as the API's JSON (camelCase keys, no None): what is sent."""
    data: dict[str, Any] = client.ApiClient().sanitize_for_serialization(obj)
    return data


def _deserialize(data: dict[str, Any], kind: str) -> Any:
    """The API's JSON as a model (a fresh copy each time)."""
    return client.ApiClient()._ApiClient__deserialize(copy.deepcopy(data), kind)


def _api_error(what: str, exc: Any, namespace: str) -> JobError:
    try:
        message = json.loads(exc.body).get("message") or exc.body
    except (TypeError, ValueError, AttributeError):
        message = exc.body or ""
    return JobError(
        f"{what} in namespace {namespace} failed: {exc.status} {exc.reason}: {message}".rstrip(": ")
    )


def _call(what: str, request: Any, namespace: str, missing_ok: bool = False) -> Any:
    """An API request; its failure as a JobError that says what was asked and why not
    (``missing_ok``: an object that is not there is no failure)."""
    try:
        return request()
    except ApiException as exc:
        if missing_ok and exc.status == 404:
            return None
        raise _api_error(what, exc, namespace) from None
    except (OSError, urllib3.exceptions.HTTPError) as exc:  # no connection
        raise JobError(f"{what}: the Kubernetes API server cannot be reached: {exc}") from None
