"""The Docker runtime: one engine container per trial through the Docker SDK, always removed afterwards,
plus `gc()` for containers whose llmplay process is provably gone (never those of a run still going)."""

from __future__ import annotations

import contextlib
import shlex
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import docker
import docker.errors
import docker.types

from llmplay.engines.base import IMAGE_VERSION_LABELS, Engine
from llmplay.engines.llamacpp import CPU_IMAGE, CPU_IMAGE_REPO
from llmplay.errors import EngineStartError, InfrastructureError
from llmplay.runtime import dockerd
from llmplay.runtime.base import (
    BIND_FAILED,
    Endpoint,
    EngineDescription,
    Runtime,
    free_port,
    port_in_use,
    probe_version,
    require_free_port,
    tail_lines,
    wait_healthy,
)
from llmplay.runtime.labels import (
    LABEL_ENGINE,
    LABEL_HOST,
    LABEL_INSTANCE,
    LABEL_PID,
    LABEL_PID_STARTED,
    LABEL_RUN,
)
from llmplay.runtime.owner import Owner, process_started
from llmplay.spec import EngineSpec, gpu_count

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container
    from docker.models.images import Image
    from docker.types import DeviceRequest

STOP_TIMEOUT_S = 10
CPU_IMAGE_HINT = "build it: `llmplay engine build-cpu` (or scripts/cpu-engine.sh)"


def connect(docker_host: str | None = None, timeout_s: float = 120.0) -> DockerClient:
    """A client for a daemon that answers, or an InfrastructureError saying how to start one."""
    if docker_host:
        try:
            client = docker.DockerClient(base_url=docker_host, timeout=int(timeout_s))
            client.ping()
            return client
        except Exception as exc:
            raise InfrastructureError(
                f"Docker daemon at {docker_host} unreachable ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); start dockerd there"
            ) from None
    return dockerd.client(timeout_s)


def _gpu_requests(gpus: int | tuple[str, ...]) -> list[DeviceRequest]:
    if isinstance(gpus, tuple):
        return [docker.types.DeviceRequest(device_ids=list(gpus), capabilities=[["gpu"]])] if gpus else []
    if gpus:
        # -1 is Docker's "all"
        return [docker.types.DeviceRequest(count=int(gpus), capabilities=[["gpu"]])]
    return []


def _is_gpu_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "device driver" in text or "nvidia" in text or "capabilities: [[gpu]]" in text


def image_hint(image: str) -> str:
    """How to get a missing image: build the CPU ones (any llama-cpp-python release), pull any other."""
    if image == CPU_IMAGE:
        return CPU_IMAGE_HINT
    repo, _, tag = image.rpartition(":")
    if repo == CPU_IMAGE_REPO:
        return f"build it: `llmplay engine build-cpu --llama-cpp-python {tag}`"
    return f"pull it: `docker pull {image}`"


def image_missing(image: str) -> str:
    return f"image {image} not found locally; {image_hint(image)}"


def require_images(client: DockerClient, images: list[str]) -> None:
    """An InfrastructureError naming every image not on this daemon, and how to get each, before anything starts."""
    missing = []
    for image in images:
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            missing.append(image_missing(image))
        except docker.errors.APIError as exc:
            raise InfrastructureError(f"Docker could not inspect image {image}: {exc.explanation or exc}") from None
    if missing:
        raise InfrastructureError("; ".join(missing))


def image_version_labels(image: Image) -> dict[str, str]:
    """The labels of `image` that say what it is (llmplay's own and the OCI ones), for the archive."""
    labels = image.labels or {}
    return {str(k): str(v) for k, v in labels.items() if k.startswith(("llmplay.", "org.opencontainers.image."))}


def _start_failure(
    exc: docker.errors.APIError, spec: EngineSpec, image_ref: str, host_port: int, bind_host: str
) -> InfrastructureError:
    """What a refused `docker run` means, and how to fix it where the cause is known."""
    message = exc.explanation or str(exc)
    if BIND_FAILED.search(message):  # another program took the port between choosing it and the start
        return EngineStartError(port_in_use(host_port, bind_host, image_ref, f"Docker: {message}"))
    if gpu_count(spec.gpus) and _is_gpu_error(exc):
        return InfrastructureError(
            f"GPUs requested but Docker cannot provide them: {message}; install "
            "nvidia-container-toolkit, run `nvidia-ctk runtime configure "
            "--runtime=docker` and restart dockerd (or set gpus: 0)"
        )
    if spec.model_dir and "bind source path does not exist" in message:
        return InfrastructureError(
            f"engine.model_dir {spec.model_dir} does not exist where Docker runs; expected the directory "
            "holding the model's files (nothing was created)"
        )
    return InfrastructureError(f"Docker could not start {image_ref}: {message}")


class DockerRuntime(Runtime):
    """`with DockerRuntime().start(spec, engine, labels) as endpoint:` runs one container."""

    kind = "docker"

    def __init__(
        self, client: DockerClient | None = None, *, docker_host: str | None = None, bind_host: str = "127.0.0.1"
    ):
        self._client = client
        self._own_client = client is None
        self.docker_host = docker_host
        self.bind_host = bind_host
        self.container: Container | None = None  # docker SDK Container while it exists (telemetry reads its stats)
        self._lock = threading.RLock()
        self._info: EngineDescription | None = None
        self._final_logs = ""
        self._instance = ""

    @property
    def client(self) -> DockerClient:
        if self._client is None:
            self._client = connect(self.docker_host)
        return self._client

    def start(self, spec: EngineSpec, engine: Engine, labels: Mapping[str, str] | None = None) -> Endpoint:
        if self.container is not None:
            raise RuntimeError("this DockerRuntime already runs a container; use one runtime per start")
        image_ref = spec.image or engine.default_image
        self._register()
        self._instance = uuid.uuid4().hex[:12]
        try:
            return self._start(spec, engine, labels, image_ref)
        except BaseException:
            if self.container is None and self._client is not None:
                # Interrupted between create and start (or the start failed): find it by its label.
                with contextlib.suppress(Exception):
                    self._remove_instance(self._instance)
            self.stop()
            raise

    def _start(self, spec: EngineSpec, engine: Engine, labels: Mapping[str, str] | None, image_ref: str) -> Endpoint:
        client = self.client
        try:
            image = client.images.get(image_ref)
        except docker.errors.ImageNotFound:
            raise InfrastructureError(image_missing(image_ref)) from None
        except docker.errors.APIError as exc:
            raise InfrastructureError(f"Docker could not inspect image {image_ref}: {exc.explanation or exc}") from None

        container_port = spec.port or engine.default_port
        if spec.network_mode == "host":
            require_free_port(self.bind_host, container_port, f"the {engine.kind} container (network_mode: host)")
        host_port = container_port if spec.network_mode == "host" else free_port(self.bind_host)
        command = engine.command(spec, container_port)
        all_labels = {str(k): str(v) for k, v in (labels or {}).items()}
        all_labels.update({LABEL_INSTANCE: self._instance, **owner_labels(), LABEL_ENGINE: engine.kind})
        all_labels.setdefault(LABEL_RUN, "adhoc")
        kwargs = self._run_options(spec, engine, command, all_labels, container_port, host_port)
        digests = image.attrs.get("RepoDigests") or []
        image_labels = image_version_labels(image)
        info = EngineDescription(
            runtime=self.kind,
            engine=engine.kind,
            image=image_ref,
            image_id=image.id,
            image_digest=digests[0] if digests else image.id,
            command=(image_ref, *command),
            command_line=shlex.join([image_ref, *command]),
            container_name=str(kwargs["name"]),
            host_port=host_port,
            container_port=container_port,
            labels=all_labels,
            gpus=spec.gpus if isinstance(spec.gpus, int) else tuple(spec.gpus),
            image_labels=image_labels,
        )
        self._info = info
        try:
            self.container = client.containers.run(image_ref, **kwargs)
        except docker.errors.APIError as exc:
            raise _start_failure(exc, spec, image_ref, host_port, self.bind_host) from None
        self._info = info = replace(info, container_id=self.container.id)
        base_url = f"http://127.0.0.1:{host_port}"
        health_s = wait_healthy(
            base_url + (spec.health_path or engine.health_path),
            spec.health_timeout_s,
            self._exit_code,
            self.logs,
            f"{engine.kind} container {kwargs['name']} ({image_ref})",
        )
        reported = probe_version(base_url, engine, self.logs(tail=200))
        labelled = next((image_labels[k] for k in IMAGE_VERSION_LABELS if image_labels.get(k)), None)
        # The label names the release an image was built from; an engine built without its git metadata
        # reports a placeholder (llama.cpp from an sdist: b0-unknown), so the label wins and both are kept.
        self._info = info = replace(
            info,
            health_s=health_s,
            engine_version=labelled or reported,
            engine_version_reported=reported,
            base_url=base_url,
        )
        return Endpoint(base_url, engine.served_model(spec), info, self.stop)

    def _run_options(
        self,
        spec: EngineSpec,
        engine: Engine,
        command: list[str],
        labels: Mapping[str, str],
        container_port: int,
        host_port: int,
    ) -> dict[str, object]:
        """The docker SDK's `containers.run` arguments for this engine container."""
        kwargs: dict[str, object] = {
            "command": command,
            "detach": True,
            "labels": dict(labels),
            "name": f"llmplay-{engine.kind}-{self._instance}",
            "environment": dict(spec.env),
            "device_requests": _gpu_requests(spec.gpus) or None,
        }
        if spec.shm_size:
            kwargs["shm_size"] = spec.shm_size
        if spec.ipc_mode:
            kwargs["ipc_mode"] = spec.ipc_mode
        if spec.network_mode == "host":
            kwargs["network_mode"] = "host"
        else:
            kwargs["ports"] = {f"{container_port}/tcp": (self.bind_host, host_port)}
        if spec.model_dir:
            # A bind *mount* (not a volume bind): the daemon refuses a missing source instead of creating it as an
            # empty root-owned directory, so a wrong model_dir fails here, clearly, not after the engine starts.
            source = str(Path(spec.model_dir).expanduser())
            kwargs["mounts"] = [docker.types.Mount(engine.model_path_in_container, source, type="bind", read_only=True)]
        return kwargs

    def _exit_code(self) -> int | None:
        container = self.container
        assert container is not None  # asked only while the container exists
        try:
            container.reload()
        except docker.errors.NotFound:
            return -1
        state = container.attrs.get("State", {})
        if state.get("Status") in ("exited", "dead"):
            return int(state.get("ExitCode", -1))
        return None

    def alive(self) -> bool:
        return self.container is not None and self._exit_code() is None

    def _remove_instance(self, instance: str) -> None:
        # ignore_removed: the SDK inspects each listed container, and one may be removed between list and inspect
        for c in self.client.containers.list(
            all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"}, ignore_removed=True
        ):
            remove_container(c)

    def logs(self, tail: int | None = None) -> str:
        container = self.container
        if container is None:
            return tail_lines(self._final_logs, tail) if tail else self._final_logs
        try:
            raw = container.logs(stdout=True, stderr=True, tail=tail if tail else "all")
        except docker.errors.NotFound:
            return self._final_logs
        return str(raw.decode("utf-8", errors="replace"))

    def stop(self) -> None:
        # Reentrant: a second Ctrl-C may call stop_all() while this thread is inside stop(); the nested
        # call then force-removes the same container again instead of deadlocking.
        with self._lock:
            container = self.container
            try:
                if container is not None:
                    with contextlib.suppress(docker.errors.APIError):
                        container.stop(timeout=STOP_TIMEOUT_S)
                    with contextlib.suppress(docker.errors.APIError):
                        self._final_logs = container.logs(stdout=True, stderr=True).decode("utf-8", errors="replace")
                    remove_container(container)
            finally:
                self.container = None
                self._unregister()
                if self._own_client and self._client is not None:
                    self._client.close()
                    self._client = None

    def describe(self) -> EngineDescription | None:
        return self._info


def owner_labels(owner: Owner | None = None) -> dict[str, str]:
    """The labels naming the llmplay process that owns a container (this process unless told)."""
    owner = owner or Owner.current()
    return {LABEL_PID: str(owner.pid), LABEL_HOST: owner.host, LABEL_PID_STARTED: f"{owner.started:.2f}"}


ORPHAN, LIVE, OTHER_HOST, UNPROVEN = "orphan", "live", "other host", "unproven"


def being_removed(exc: docker.errors.APIError) -> bool:
    """Docker's answer when another client is already removing the container: a conflict, not a failure."""
    return exc.status_code == 409 and "already in progress" in str(exc)


def remove_container(container: Container) -> bool:
    """Force-remove; False when it was already gone or another client is removing it (gone all the same). Docker's
    other refusals raise its APIError."""
    try:
        container.remove(force=True)
    except docker.errors.APIError as exc:
        if isinstance(exc, docker.errors.NotFound) or being_removed(exc):
            return False
        raise
    return True


@dataclass(frozen=True)
class Collectable:
    """One llmplay container as gc judged it: `kind` is ORPHAN, LIVE, OTHER_HOST or UNPROVEN, `why` says how."""

    name: str
    run_id: str
    kind: str
    why: str

    def describe(self) -> str:
        return f"{self.name} (run {self.run_id}: {self.why})"


def judge(labels: Mapping[str, str]) -> tuple[str, str]:
    """Whether a container's owning llmplay process is provably gone (ORPHAN), still going (LIVE), on another host
    (OTHER_HOST), or cannot be told from its labels (UNPROVEN: an older llmplay labelled pid and host only)."""
    pid, host = labels.get(LABEL_PID, ""), labels.get(LABEL_HOST, "")
    owner = Owner.from_fields(host, pid, labels.get(LABEL_PID_STARTED))
    if owner is not None:
        alive = owner.alive()
        if alive is None:
            return OTHER_HOST, f"owned by {owner.describe()}, which this host cannot look into"
        if alive:
            return LIVE, f"its run is still going ({owner.describe()})"
        return ORPHAN, f"its llmplay process ({owner.describe()}) is gone"
    if host and host != Owner.current().host:
        return OTHER_HOST, f"owned by a process on {host}, which this host cannot look into"
    if not pid.isdigit() or not host:
        return UNPROVEN, "no owner labels (made by an older llmplay or by hand)"
    if process_started(int(pid)) is None:
        return ORPHAN, f"its llmplay process (pid {pid}) is gone"
    # Older labels lack the start time: pid may be the owner or an unrelated process that got its number.
    return UNPROVEN, f"pid {pid} runs, but an older llmplay labelled it without the start time that tells its owner"


@dataclass(frozen=True)
class Collection:
    """What gc removed and what it left alone, each with the reason."""

    removed: tuple[Collectable, ...]
    kept: tuple[Collectable, ...]

    def removed_names(self) -> list[str]:
        return [f"{c.name} (run {c.run_id})" for c in self.removed]


def gc(client: DockerClient | None = None, *, run_id: str | None = None, force: bool = False) -> Collection:
    """Remove the llmplay containers (only `run_id`'s if given) whose owning process is provably gone. `force`
    also removes those gc cannot prove orphaned (other hosts' on a shared daemon, older labels); a container whose
    owner is alive on this host is never removed."""
    own = client is None
    client = client or connect()
    selector = f"{LABEL_RUN}={run_id}" if run_id else LABEL_RUN
    removed, kept = [], []
    try:
        for c in client.containers.list(all=True, filters={"label": selector}, ignore_removed=True):
            labels = c.labels or {}
            kind, why = judge(labels)
            found = Collectable(c.name, labels.get(LABEL_RUN, "?"), kind, why)
            if kind == LIVE or (kind != ORPHAN and not force):
                kept.append(found)
                continue
            # Another process may get there first (the dead run's watchdog, or a run starting beside this one that
            # collects orphans too): the container goes all the same, and a run must not stop over it.
            try:
                if not remove_container(c):
                    continue
            except docker.errors.APIError as exc:
                raise InfrastructureError(f"Docker could not remove {c.name}: {exc.explanation or exc}") from None
            removed.append(found)
    finally:
        if own:
            client.close()
    return Collection(tuple(removed), tuple(kept))
