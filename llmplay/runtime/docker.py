"""The Docker runtime: one engine container per trial through the Docker SDK, always removed afterwards,
plus `gc()` for containers an earlier llmplay process left behind."""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types

from llmplay.engines.base import IMAGE_VERSION_LABELS, Engine
from llmplay.engines.llamacpp import CPU_IMAGE
from llmplay.errors import InfrastructureError
from llmplay.runtime import dockerd
from llmplay.runtime.base import Endpoint, Runtime, free_port, probe_version, tail_lines, wait_healthy
from llmplay.spec import EngineSpec

LABEL_RUN = "llmplay.run"
LABEL_TRIAL = "llmplay.trial"
LABEL_INSTANCE = "llmplay.instance"  # unique per start, to find a container whose start failed
LABEL_PID = "llmplay.pid"  # the llmplay process that owns it, so gc can tell orphans from live runs
LABEL_HOST = "llmplay.host"
STOP_TIMEOUT_S = 10
CPU_IMAGE_HINT = "build it: `llmplay engine build-cpu` (or scripts/cpu-engine.sh)"


def connect(docker_host: str | None = None, timeout_s: float = 120.0) -> Any:
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


def _gpu_requests(gpus: int | tuple[str, ...]) -> list[Any]:
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
    """How to get a missing image: build the CPU one, pull any other."""
    return CPU_IMAGE_HINT if image == CPU_IMAGE else f"pull it: `docker pull {image}`"


def image_version_labels(image: Any) -> dict[str, str]:
    """The labels of `image` that say what it is (llmplay's own and the OCI ones), for the archive."""
    labels = image.labels or {}
    return {str(k): str(v) for k, v in labels.items() if k.startswith(("llmplay.", "org.opencontainers.image."))}


class DockerRuntime(Runtime):
    """`with DockerRuntime().start(spec, engine, labels) as endpoint:` runs one container."""

    kind = "docker"

    def __init__(self, client: Any = None, *, docker_host: str | None = None, bind_host: str = "127.0.0.1"):
        self._client = client
        self._own_client = client is None
        self.docker_host = docker_host
        self.bind_host = bind_host
        self.container: Any = None  # docker SDK Container while it exists (telemetry reads its stats)
        self._lock = threading.RLock()
        self._info: dict[str, Any] = {}
        self._final_logs = ""
        self._instance = ""

    @property
    def client(self) -> Any:
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
            raise InfrastructureError(f"image {image_ref} not found locally; {image_hint(image_ref)}") from None
        except docker.errors.APIError as exc:
            raise InfrastructureError(f"Docker could not inspect image {image_ref}: {exc.explanation or exc}") from None

        container_port = spec.port or engine.default_port
        host_network = spec.network_mode == "host"
        host_port = container_port if host_network else free_port(self.bind_host)
        command = engine.command(spec, container_port)
        instance = self._instance
        all_labels = {str(k): str(v) for k, v in (labels or {}).items()}
        all_labels.update(
            {
                LABEL_INSTANCE: instance,
                LABEL_PID: str(os.getpid()),
                LABEL_HOST: socket.gethostname(),
                "llmplay.engine": engine.kind,
            }
        )
        all_labels.setdefault(LABEL_RUN, "adhoc")
        kwargs: dict[str, Any] = {
            "command": command,
            "detach": True,
            "labels": all_labels,
            "name": f"llmplay-{engine.kind}-{instance}",
            "environment": dict(spec.env),
            "device_requests": _gpu_requests(spec.gpus) or None,
        }
        if spec.shm_size:
            kwargs["shm_size"] = spec.shm_size
        if spec.ipc_mode:
            kwargs["ipc_mode"] = spec.ipc_mode
        if host_network:
            kwargs["network_mode"] = "host"
        else:
            kwargs["ports"] = {f"{container_port}/tcp": (self.bind_host, host_port)}
        if spec.model_dir:
            # A bind *mount* (not a volume bind): the daemon refuses a missing source instead of creating it as an
            # empty root-owned directory, so a wrong model_dir fails here, clearly, not after the engine starts.
            source = str(Path(spec.model_dir).expanduser())
            kwargs["mounts"] = [docker.types.Mount(engine.model_path_in_container, source, type="bind", read_only=True)]
        digests = image.attrs.get("RepoDigests") or []
        image_labels = image_version_labels(image)
        self._info = {
            "runtime": self.kind,
            "engine": engine.kind,
            "engine_version": None,
            "image": image_ref,
            "image_id": image.id,
            "image_digest": digests[0] if digests else image.id,
            "command": [image_ref, *command],
            "command_line": shlex.join([image_ref, *command]),
            "container_id": None,
            "container_name": kwargs["name"],
            "host_port": host_port,
            "container_port": container_port,
            "labels": all_labels,
            "gpus": spec.gpus if isinstance(spec.gpus, int) else list(spec.gpus),
            "image_labels": image_labels,
        }
        try:
            self.container = client.containers.run(image_ref, **kwargs)
        except docker.errors.APIError as exc:
            message = exc.explanation or str(exc)
            if spec.gpus and _is_gpu_error(exc):
                raise InfrastructureError(
                    f"GPUs requested but Docker cannot provide them: {message}; install "
                    "nvidia-container-toolkit, run `nvidia-ctk runtime configure "
                    "--runtime=docker` and restart dockerd (or set gpus: 0)"
                ) from None
            if spec.model_dir and "bind source path does not exist" in message:
                raise InfrastructureError(
                    f"engine.model_dir {spec.model_dir} does not exist where Docker runs; expected the directory "
                    "holding the model's files (nothing was created)"
                ) from None
            raise InfrastructureError(f"Docker could not start {image_ref}: {message}") from None
        self._info["container_id"] = self.container.id
        base_url = f"http://127.0.0.1:{host_port}"
        self._info["health_s"] = wait_healthy(
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
        self._info["engine_version"] = labelled or reported
        self._info["engine_version_reported"] = reported
        self._info["base_url"] = base_url
        return Endpoint(base_url, engine.served_model(spec), dict(self._info), self.stop)

    def _exit_code(self) -> int | None:
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return -1
        state = self.container.attrs.get("State", {})
        if state.get("Status") in ("exited", "dead"):
            return int(state.get("ExitCode", -1))
        return None

    def alive(self) -> bool:
        return self.container is not None and self._exit_code() is None

    def _remove_instance(self, instance: str) -> None:
        for c in self.client.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"}):
            with contextlib.suppress(docker.errors.NotFound):
                c.remove(force=True)

    def logs(self, tail: int | None = None) -> str:
        container = self.container
        if container is None:
            return tail_lines(self._final_logs, tail) if tail else self._final_logs
        try:
            raw = container.logs(stdout=True, stderr=True, tail=tail if tail else "all")
        except docker.errors.NotFound:
            return self._final_logs
        return raw.decode("utf-8", errors="replace")

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
                    try:
                        container.remove(force=True)
                    except docker.errors.NotFound:
                        pass
                    except docker.errors.APIError as exc:
                        if "already in progress" not in str(exc):
                            raise
            finally:
                self.container = None
                self._unregister()
                if self._own_client and self._client is not None:
                    self._client.close()
                    self._client = None

    def describe(self) -> dict[str, Any]:
        return dict(self._info)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def gc(client: Any = None, *, run_id: str | None = None, orphans_only: bool = False) -> list[str]:
    """Remove containers labelled `llmplay.run` (only `run_id`'s if given; with orphans_only, only those whose
    llmplay process on this host is gone). Returns `name (run <id>)` for each one removed."""
    own = client is None
    client = client or connect()
    selector = f"{LABEL_RUN}={run_id}" if run_id else LABEL_RUN
    removed = []
    try:
        for c in client.containers.list(all=True, filters={"label": selector}):
            labels = c.labels or {}
            if orphans_only:
                pid = labels.get(LABEL_PID, "")
                if labels.get(LABEL_HOST) == socket.gethostname() and pid.isdigit() and _pid_alive(int(pid)):
                    continue
            try:
                c.remove(force=True)
            except docker.errors.NotFound:
                continue
            removed.append(f"{c.name} (run {labels.get(LABEL_RUN, '?')})")
    finally:
        if own:
            client.close()
    return removed
