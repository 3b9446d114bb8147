"""rollhub.sandbox: containers and processes that code-running envs execute commands in.

    from rollhub.sandbox import DockerBackend, Limits
    backend = DockerBackend()                      # DOCKER_HOST selects a remote engine
    async with await backend.start("rollhub/base:bookworm", Limits(memory_mb=512)) as box:
        result = await box.exec("python3 -V", timeout_s=30)
    await backend.close()                          # removes anything still running

Backends are imported lazily so `import rollhub.sandbox` stays light (no docker SDK).
"""

from rollhub.sandbox.base import ExecResult, Limits, Sandbox, SandboxBackend, SandboxError

__all__ = ["DockerBackend", "ExecResult", "Limits", "ProcessBackend", "Sandbox", "SandboxBackend", "SandboxError"]


def __getattr__(name: str):
    if name == "DockerBackend":
        from rollhub.sandbox.docker_backend import DockerBackend

        return DockerBackend
    if name == "ProcessBackend":
        from rollhub.sandbox.process_backend import ProcessBackend

        return ProcessBackend
    raise AttributeError(name)
