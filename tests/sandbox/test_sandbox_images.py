"""Layered images: built offline from local files, tagged by content, reused."""

from __future__ import annotations

import pytest

from rollhub.sandbox import images

pytestmark = pytest.mark.docker


def test_layered_image_is_built_offline_and_reused(docker_client, tmp_path):
    source = tmp_path / "app"
    source.mkdir()
    (source / "hello.py").write_text("print('hello from the layer')\n")
    files = {"/srv/app": str(source)}
    steps = [
        "python3 /srv/app/hello.py > /srv/built.txt",
        (
            "python3 -c \"import urllib.request as u; u.urlopen('http://1.1.1.1', timeout=3)\" "
            "|| echo offline > /srv/net.txt"
        ),
    ]
    tag = images.build_layered_image(docker_client, images.BASE_IMAGE, files, steps, "rollhub/pytest-layer")
    built = []
    try:
        built.append(tag)
        assert tag.startswith("rollhub/pytest-layer:") and len(tag.split(":")[1]) == 16
        assert images.build_layered_image(docker_client, images.BASE_IMAGE, files, steps, "rollhub/pytest-layer") == tag
        output = docker_client.containers.run(
            tag, ["cat", "/srv/built.txt", "/srv/net.txt"], remove=True, network_mode="none"
        )
        assert output == b"hello from the layer\noffline\n"  # the build itself had no network
        (source / "hello.py").write_text("print('changed')\n")
        changed = images.build_layered_image(docker_client, images.BASE_IMAGE, files, steps, "rollhub/pytest-layer")
        built.append(changed)
        assert changed != tag
    finally:
        for name in built:
            docker_client.api.remove_image(name, force=True)


def test_missing_base_is_a_clear_error(docker_client, tmp_path):
    from rollhub.sandbox.base import SandboxError

    with pytest.raises(SandboxError, match="build it first"):
        images.build_layered_image(docker_client, "rollhub/no-such-base:x", {}, [], "rollhub/pytest-layer")
