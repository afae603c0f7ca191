#!/usr/bin/env bash
# Builds the image of charts/image/Dockerfile without a container daemon or a registry: the two
# binaries static by cargo on this host, then buildah from scratch, committed to an OCI archive a
# node imports with `ctr -n k8s.io images import FILE`. The reference is the chart's default
# image (values.yaml image.repository, tag = Chart.yaml appVersion unless image.tag is set).
#
#   charts/image/build.sh [--profile release|dev] [--output FILE]
#
# --profile dev: a quick debug build (the e2e test uses it). Default output:
# $CARGO_TARGET_DIR/image/knic-<tag>.oci.tar. Prints the archive path and the reference last.
# Needs root (or a rootless buildah setup), cargo, and buildah (apt-get install buildah).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
profile=release
output=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --profile) profile=${2:?--profile needs a value}; shift 2 ;;
    --output) output=${2:?--output needs a value}; shift 2 ;;
    -h | --help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$profile" in
  release | dev) ;;
  *) echo "build.sh: --profile must be release or dev, not $profile" >&2; exit 2 ;;
esac

# The chart's default reference: the first `repository:`/`tag:` under `image:` in values.yaml.
chart=$root/charts/knic
repository=$(awk '/^image:/ {in_image = 1; next} /^[^ #]/ {in_image = 0}
  in_image && $1 == "repository:" {print $2; exit}' "$chart/values.yaml")
tag=$(awk '/^image:/ {in_image = 1; next} /^[^ #]/ {in_image = 0}
  in_image && $1 == "tag:" {print $2; exit}' "$chart/values.yaml" | tr -d '"')
version=$(awk '$1 == "appVersion:" {print $2; exit}' "$chart/Chart.yaml" | tr -d '"')
[ -n "$tag" ] || tag=$version
if [ -z "$repository" ] || [ -z "$tag" ]; then
  echo "build.sh: no image.repository/tag in $chart/values.yaml and Chart.yaml" >&2
  exit 1
fi
reference=$repository:$tag

target=x86_64-unknown-linux-gnu
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
output=${output:-$CARGO_TARGET_DIR/image/knic-$tag.oci.tar}
mkdir -p "$(dirname "$output")"

echo "build.sh: cargo build --profile $profile --target $target (crt-static)" >&2
# The same flags as the Dockerfile's build stage (see there why --target).
(cd "$root" && RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --locked --profile "$profile" --target "$target" -p knic-driver -p knic-controller)
case "$profile" in dev) dir=debug ;; *) dir=$profile ;; esac
bin=$CARGO_TARGET_DIR/$target/$dir

# vfs works everywhere (overlay inside a container often does not); nothing is run inside the
# image, so the isolation only matters to buildah's own checks.
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs}
export BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
# A private store, so the build neither needs nor touches the host's image store.
store=$(mktemp -d "${TMPDIR:-/tmp}/knic-buildah.XXXXXX")
bh() { buildah --root "$store/root" --runroot "$store/run" "$@"; }
container=""
cleanup() {
  [ -z "$container" ] || bh rm "$container" >/dev/null 2>&1 || true
  # vfs layers can hold read-only files; make them removable first.
  chmod -R u+w "$store" 2>/dev/null || true
  rm -rf "$store"
}
trap cleanup EXIT

container=$(bh from scratch)
bh copy --chmod 0755 "$container" "$bin/knic-driver" "$bin/knic-controller" /usr/local/bin/ >/dev/null
# The Dockerfile's final stage, instruction for instruction.
bh config \
  --env PATH=/usr/local/bin \
  --user 65532:65532 \
  --entrypoint '["/usr/local/bin/knic-driver"]' \
  --label org.opencontainers.image.title=knic \
  --label "org.opencontainers.image.description=Kubernetes DRA driver for network interfaces: knic-driver and knic-controller" \
  --label org.opencontainers.image.source=https://github.com/knic-dev/knic \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  --label "org.opencontainers.image.version=$version" \
  "$container"
rm -f "$output"
bh commit --quiet --format oci --identity-label=false --rm "$container" "oci-archive:$output:$reference" >/dev/null
container=""
echo "build.sh: wrote $output ($reference); on a node: ctr -n k8s.io images import $output" >&2
echo "$output"
echo "$reference"
