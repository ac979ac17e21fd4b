"""One resource's device plugin gRPC server on a unix socket, and registration with kubelet."""

from __future__ import annotations

import logging
import os
import threading
from concurrent import futures
from typing import TYPE_CHECKING

import grpc

from . import api_pb2, api_pb2_grpc
from .allocator import AllocationError
from .devices import API_VERSION, KUBELET_SOCKET, device_list

if TYPE_CHECKING:
    from .allocator import Allocator
    from .state import CardsState

log = logging.getLogger(__name__)


def unix_target(path: str) -> str:
    return "unix://" + os.path.abspath(path)


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """The DevicePlugin service for one kind of device (``core`` or ``memory``)."""

    def __init__(self, kind: str, resource: str, cards: CardsState, allocator: Allocator,
                 stopping: threading.Event) -> None:
        self.kind = kind
        self.resource = resource
        self._cards = cards
        self._allocator = allocator
        self._stopping = stopping

    def GetDevicePluginOptions(self, request: api_pb2.Empty, context: grpc.ServicerContext) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: api_pb2.Empty, context: grpc.ServicerContext):  # type: ignore[no-untyped-def]
        version = self._cards.version
        devices = device_list(self.kind, self._cards.cards())
        log.info("ListAndWatch %s: %d device(s), %d unhealthy", self.resource, len(devices),
                 sum(d.health != "Healthy" for d in devices))
        yield api_pb2.ListAndWatchResponse(devices=devices)
        while context.is_active() and not self._stopping.is_set():
            latest = self._cards.wait_for_change(version, timeout=0.5)
            if latest == version or self._stopping.is_set():
                continue
            version = latest
            devices = device_list(self.kind, self._cards.cards())
            log.info("ListAndWatch %s: health changed, re-sending %d device(s), %d unhealthy", self.resource,
                     len(devices), sum(d.health != "Healthy" for d in devices))
            yield api_pb2.ListAndWatchResponse(devices=devices)

    def GetPreferredAllocation(self, request: api_pb2.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> api_pb2.PreferredAllocationResponse:
        responses = []
        for container in request.container_requests:
            ids = self._allocator.preferred(self.kind, list(container.available_deviceIDs),
                                            list(container.must_include_deviceIDs), container.allocation_size)
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext) -> api_pb2.AllocateResponse:
        responses = []
        for container in request.container_requests:
            try:
                responses.append(self._allocator.allocate(self.kind, list(container.devices_ids)))
            except AllocationError as error:
                log.warning("Allocate %s refused (%d device(s)): %s", self.resource, len(container.devices_ids), error)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: api_pb2.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


class ResourceServer:
    """Serves one DevicePluginService on ``<plugin dir>/<socket>``; restartable."""

    def __init__(self, service: DevicePluginService, plugin_dir: str, socket_name: str) -> None:
        self.service = service
        self.socket_name = socket_name
        self.path = os.path.join(plugin_dir, socket_name)
        self._server: grpc.Server | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        self.stop()
        try:
            os.unlink(self.path)  # a stale socket from an earlier run refuses the bind
        except FileNotFoundError:
            pass
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"dp-{self.service.kind}"))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server)
        if not server.add_insecure_port(unix_target(self.path)):
            raise OSError(f"cannot listen on {self.path}")
        server.start()
        self._server = server
        log.info("serving %s on %s", self.service.resource, self.path)

    def stop(self, grace: float = 0.5) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait(grace + 2)
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def register(self, plugin_dir: str, timeout: float = 5.0) -> None:
        """Register with kubelet; grpc.RpcError (with kubelet's reason) when refused or unreachable."""
        options = api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
        with grpc.insecure_channel(unix_target(os.path.join(plugin_dir, KUBELET_SOCKET))) as channel:
            api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(version=API_VERSION, endpoint=self.socket_name,
                                        resource_name=self.service.resource, options=options),
                timeout=timeout, wait_for_ready=False)
        log.info("registered %s (endpoint %s) with kubelet", self.service.resource, self.socket_name)
