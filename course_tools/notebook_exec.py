"""Execute notebooks headless with the current interpreter's kernel (shared by ``course run`` and
``course grade``), so that the kernel sees exactly the packages the command was started with.

Kernels talk to us over local (IPC) sockets in a private temporary folder, not TCP: nothing else
on the machine can connect, and ipykernel has no reason to warn about unencrypted TCP.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import nbformat
from ipykernel.kernelspec import RESOURCES, get_kernel_dict
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from traitlets import default

CURRENT_ENV = "course-current-env"


class CurrentEnvSpecs(KernelSpecManager):
    """Kernel specs plus one more: ipykernel running under ``sys.executable``."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        if kernel_name == CURRENT_ENV:
            return KernelSpec(resource_dir=RESOURCES, **get_kernel_dict())
        return super().get_kernel_spec(kernel_name)


class CurrentEnvKernelManager(AsyncKernelManager):
    """An async kernel manager (a sync one blocks nbclient's timeouts) that knows CURRENT_ENV and
    connects over IPC sockets in a fresh private folder (short paths: socket names have a length limit)."""

    @default("kernel_spec_manager")
    def _kernel_spec_manager_default(self) -> KernelSpecManager:
        return CurrentEnvSpecs(data_dir=self.data_dir)

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc"

    @default("ip")
    def _ip_default(self) -> str:
        return os.path.join(tempfile.mkdtemp(prefix="course-kernel-"), "k")

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart)
        if not restart:
            shutil.rmtree(os.path.dirname(self.ip), ignore_errors=True)


def kernel_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The kernel's environment: ours, with stable cell names in tracebacks (as in the tests)."""
    env = dict(os.environ)
    env["IPYKERNEL_CELL_NAME"] = "<IPY-INPUT>"
    env.update(extra or {})
    return env


def make_client(nb: nbformat.NotebookNode, cwd: Path, *, cell_timeout: int = 600,
                allow_errors: bool = False, env: dict[str, str] | None = None,
                client_class: type[NotebookClient] = NotebookClient,
                kernel_manager_class: type[AsyncKernelManager] = CurrentEnvKernelManager, **kwargs) -> NotebookClient:
    """A NotebookClient on the current-environment kernel, working in ``cwd``."""
    client = client_class(
        nb, kernel_name=CURRENT_ENV, kernel_manager_class=kernel_manager_class, timeout=cell_timeout,
        allow_errors=allow_errors, record_timing=False, resources={"metadata": {"path": str(cwd)}}, **kwargs,
    )
    client._course_env = kernel_env(env)  # handed to the kernel by execute()
    return client


def execute(client: NotebookClient) -> nbformat.NotebookNode:
    """Run every cell; the kernel gets the environment chosen in ``make_client``."""
    return client.execute(env=client._course_env)
