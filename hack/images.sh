#!/usr/bin/env bash
# Build the project's container images here, without a Docker engine or a registry, into a
# per-machine cache outside the repo.
#
#   hack/images.sh ensure [NAME...]   build what is missing or stale (default: all), print progress
#   hack/images.sh path NAME          print NAME's OCI archive path (building it if needed)
#   hack/images.sh ref NAME           print the image reference (name:tag) that archive carries
#
# Images (NAME: reference; KEY = 12 hex digits of the hash of the image's inputs):
#   base       schedlock.local/python:3.11-slim-bookworm-KEY
#              Debian bookworm's python3 (minbase, from Debian's packages with mmdebstrap), standing
#              in for python:3.11-slim-bookworm; KEY hashes its recipe (this file's build_base,
#              packages, mirrors).
#   schedlock  schedlock.local/schedlock:VERSION-KEY
#              the repo's own Dockerfile (its default, last stage: every command, the operator
#              with kopf and the Kubernetes client), built with `buildah bud --isolation chroot`
#              FROM base; KEY hashes what the build context lets through (.dockerignore:
#              Dockerfile, pyproject.toml, README.md, src/, operator/, sidecar/), the recipe and base's KEY.
#   schedlock-sidecar  schedlock.local/schedlock-sidecar:VERSION-KEY
#              the same Dockerfile's target schedlock-sidecar (what `schedlock sidecar` imports
#              only); keyed like schedlock.
#   demo-app   schedlock.local/demo-app:KEY
#              examples/demo-app/Containerfile FROM base; KEY hashes examples/demo-app/ and base's.
# A Helm install names an image as image.repository=${ref%:*} image.tag=${ref##*:}.  The tag
# follows the content, so a node never runs a stale image under a reused tag.
#
# Archives: CACHE/NAME-KEY.oci.tar, an OCI image layout tarball whose index.json names the image
# twice (org.opencontainers.image.ref.name and containerd's io.containerd.image.name), so
# `ctr -n k8s.io images import FILE` tags it with the reference above without --base-name.
# CACHE is ${SCHEDLOCK_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/schedlock/images}; buildah's
# storage (vfs driver) lives in CACHE/storage, never in the host's default container storage.
# Needs root (mmdebstrap --mode=root, buildah's chroot isolation); buildah and mmdebstrap come
# from `hack/tools.sh ensure images`.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SCHEDLOCK_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/schedlock/images}"
REGISTRY="schedlock.local"
NAMES=(base schedlock schedlock-sidecar demo-app)

SUITE="bookworm"
MIRROR="http://deb.debian.org/debian"
SECURITY_MIRROR="http://deb.debian.org/debian-security"
# What the official slim image has for Python: the interpreter, venv/ensurepip, TLS roots and
# time zones.  Nothing else (no docs, no compiler).
BASE_PACKAGES=(python3 python3-venv ca-certificates tzdata)
# Bump to rebuild everything once per machine (e.g. to take Debian's security updates).
RECIPE="r1"

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { echo "error: $*" >&2; exit 2; }

# Every buildah call goes to the cache's own storage: a storage.conf of ours replaces the host's
# (CONTAINERS_STORAGE_CONF), so no option of the host's default storage leaks in either.  Its
# network configuration too (CONTAINERS_CONF): a RUN step sets up the CNI library, which
# otherwise creates /etc/cni/net.d/cni.lock on the host and leaves it there.
bah() {
  CONTAINERS_STORAGE_CONF="$CACHE/storage.conf" CONTAINERS_CONF="$CACHE/containers.conf" \
    STORAGE_DRIVER=vfs BUILDAH_ISOLATION=chroot buildah "$@"
}

setup() {
  mkdir -p "$CACHE"
  if ! command -v buildah >/dev/null || ! command -v mmdebstrap >/dev/null; then
    bash "$REPO/hack/tools.sh" ensure images
  fi
  [[ "$(id -u)" -eq 0 ]] || die "building images needs root (mmdebstrap --mode=root, buildah --isolation chroot)"
  cat >"$CACHE/storage.conf.$$" <<EOF
[storage]
driver = "vfs"
graphroot = "$CACHE/storage"
runroot = "$CACHE/run"
EOF
  mv "$CACHE/storage.conf.$$" "$CACHE/storage.conf"
  mkdir -p "$CACHE/cni"
  cat >"$CACHE/containers.conf.$$" <<EOF
[network]
network_config_dir = "$CACHE/cni"
EOF
  mv "$CACHE/containers.conf.$$" "$CACHE/containers.conf"
  WORK="$(mktemp -d "$CACHE/tmp.XXXXXX")"
}

# ---------------------------------------------------------------------------- keys and refs

# tree_hash ROOT PATH...: content and names of the files under PATHs (relative to ROOT), minus
# the byte-code caches that .dockerignore keeps out of the build context too.
tree_hash() {
  local root="$1"; shift
  (
    cd "$root"
    find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | LC_ALL=C sort -z |
      xargs -0 sha256sum
  ) | sha256sum | cut -c1-64
}

text_hash() { printf '%s\n' "$@" | sha256sum | cut -c1-64; }

# inputs NAME [ROOT]: the paths NAME's build context holds.  For schedlock, the `!` lines of the
# allow-list .dockerignore (tests/integration/test_chart.py checks they are exactly what the
# Dockerfile COPYs), plus the Dockerfile and the ignore file themselves.
inputs() {
  case "$1" in
    base) ;;
    schedlock | schedlock-sidecar)
      echo Dockerfile
      echo .dockerignore
      sed -n 's|^!\(.*\)$|\1|p' "${2:-$REPO}/.dockerignore" | sed 's|/$||' ;;
    demo-app) echo examples/demo-app ;;
  esac
}

# key NAME [ROOT]: the cache key of NAME built from the tree at ROOT (default: the repo): its
# inputs and the text of the functions that build it (comments aside), so changing a recipe
# here rebuilds what it makes.
key() {
  local root="${2:-$REPO}" paths
  case "$1" in
    base)
      text_hash "$RECIPE" "$SUITE" "$MIRROR" "$SECURITY_MIRROR" "${BASE_PACKAGES[*]}" \
        "$MOUNT_POINTS" "$(declare -f build_base base_customize export_archive)" | cut -c1-12 ;;
    schedlock | schedlock-sidecar | demo-app)
      mapfile -t paths < <(inputs "$1" "$root")
      text_hash "$RECIPE" "$(key base)" "$(declare -f "build_${1//-/_}" build_mounts)" \
        "$([[ "$1" == demo-app ]] || declare -f build_dockerfile_target)" \
        "$(tree_hash "$root" "${paths[@]}")" | cut -c1-12 ;;
    *) die "unknown image: $1 (one of: ${NAMES[*]})" ;;
  esac
}

version() { sed -n 's/^__version__ = "\(.*\)"$/\1/p' "${1:-$REPO}/src/schedlock/__init__.py"; }

# ref NAME [ROOT], archive NAME [ROOT]: NAME's image reference and archive path.
ref() {
  case "$1" in
    base) echo "$REGISTRY/python:3.11-slim-$SUITE-$(key base)" ;;
    schedlock | schedlock-sidecar)
      echo "$REGISTRY/$1:$(version "${2:-}")-$(key "$1" "${2:-}")" ;;
    demo-app) echo "$REGISTRY/demo-app:$(key demo-app "${2:-}")" ;;
    *) die "unknown image: $1 (one of: ${NAMES[*]})" ;;
  esac
}

archive() { echo "$CACHE/$1-$(key "$1" "${2:-}").oci.tar"; }

# snapshot NAME DIR: a copy of NAME's build context.  Images are built from it and keyed by it,
# so an image is exactly the inputs its key names even when the tree is edited meanwhile.
snapshot() {
  local paths
  mapfile -t paths < <(inputs "$1")
  tar -C "$REPO" --exclude=__pycache__ --exclude='*.pyc' -cf - "${paths[@]}" | tar -C "$2" -xf -
}

# ---------------------------------------------------------------------------- helpers

# One scratch directory per run (under the cache: the rootfs tarball is 150 MB, /tmp may be
# small), removed on exit with any working container a failed step left behind.
WORK=""
CONTAINERS=()
cleanup() {
  local c
  for c in "${CONTAINERS[@]}"; do bah rm "$c" >/dev/null 2>&1 || true; done
  [[ -z "$WORK" ]] || rm -rf "$WORK"
}
trap cleanup EXIT

scratch_dir() {
  [[ -n "$WORK" ]] || die "scratch_dir before setup"
  mktemp -d "$WORK/$1.XXXXXX"
}

# export_archive REF FILE [KEEP_DIFF_IDS_JSON]: the image as an OCI layout tarball that containerd
# imports by name.  buildah writes only org.opencontainers.image.ref.name; `ctr images import`
# names images from io.containerd.image.name (a full ref.name is dropped unless --base-name
# matches), so both go in.
#
# buildah 1.28 also leaves the empty files it bind-mounts over during RUN steps (/etc/hosts,
# /etc/resolv.conf, /etc/hostname, and the -v targets of build_mounts) in the layer the step
# writes (containers/buildah#4242); a `docker build` of the same Dockerfile has none of them.
# Layers other than KEEP's (the base's, left byte for byte) lose those empty entries, and the
# digests that name them are recomputed.
MOUNT_POINTS="etc/hosts etc/resolv.conf etc/hostname etc/pip.conf run/host-ca.crt"
export_archive() {
  local ref="$1" out="$2" keep="${3:-[]}" dir
  dir="$(scratch_dir export)"
  bah push --quiet "$ref" "oci:$dir/layout:$ref"
  python3 - "$dir/layout" "$ref" "$keep" "$MOUNT_POINTS" <<'EOF'
import gzip, hashlib, io, json, os, sys, tarfile

layout, ref, keep, mount_points = sys.argv[1], sys.argv[2], set(json.loads(sys.argv[3])), set(sys.argv[4].split())

def path(digest):
    return os.path.join(layout, "blobs", *digest.split(":"))

def load(digest):
    with open(path(digest), "rb") as f:
        return f.read()

def store(data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with open(path(digest), "wb") as f:
        f.write(data)
    return {"digest": digest, "size": len(data)}

with open(os.path.join(layout, "index.json")) as f:
    index = json.load(f)
(entry,) = index["manifests"]
manifest = json.loads(load(entry["digest"]))
config = json.loads(load(manifest["config"]["digest"]))
changed = False
for i, layer in enumerate(manifest["layers"]):
    diff_id = config["rootfs"]["diff_ids"][i]
    if diff_id in keep or not layer["mediaType"].endswith("tar+gzip"):
        continue
    source = tarfile.open(fileobj=io.BytesIO(gzip.decompress(load(layer["digest"]))))
    members = source.getmembers()
    empty_mount_point = lambda m: m.isfile() and m.size == 0 and m.name.removeprefix("./") in mount_points
    if not any(map(empty_mount_point, members)):
        continue
    tidy = io.BytesIO()
    with tarfile.open(fileobj=tidy, mode="w", format=tarfile.PAX_FORMAT) as target:
        for m in members:
            if not empty_mount_point(m):
                target.addfile(m, source.extractfile(m) if m.isfile() else None)
    raw = tidy.getvalue()
    os.remove(path(layer["digest"]))
    layer.update(store(gzip.compress(raw, compresslevel=6, mtime=0)))
    config["rootfs"]["diff_ids"][i] = "sha256:" + hashlib.sha256(raw).hexdigest()
    changed = True
if changed:
    os.remove(path(manifest["config"]["digest"]))
    manifest["config"].update(store(json.dumps(config).encode()))
    os.remove(path(entry["digest"]))
    entry.update(store(json.dumps(manifest).encode()))
annotations = entry.setdefault("annotations", {})
annotations["org.opencontainers.image.ref.name"] = ref
annotations["io.containerd.image.name"] = ref
with open(os.path.join(layout, "index.json"), "w") as f:
    json.dump(index, f)
EOF
  tar -C "$dir/layout" --sort=name --owner=0 --group=0 --numeric-owner -cf "$out.tmp" .
  mv "$out.tmp" "$out"
}

# base_diff_ids: the base image's layers, which the images built on it share unchanged.
base_diff_ids() {
  bah inspect --type image "$(ref base)" |
    python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["OCIv1"]["rootfs"]["diff_ids"]))'
}

# The base image must be in buildah's storage for FROM (the builds never pull): after a wiped
# storage, load it back from its archive.
load_base() {
  local ref
  ref="$(ref base)"
  bah inspect --type image "$ref" >/dev/null 2>&1 && return 0
  log "base: loading $ref into buildah's storage from its archive"
  local id
  id="$(bah pull --quiet "oci-archive:$(archive base)")"
  bah tag "$id" "$ref"
}

# drop_stale NAME ARCHIVE REF: NAME's other archives and images, and what a build left behind.
drop_stale() {
  local name="$1" keep="$2" current="$3" f img
  # NAME-KEY only: schedlock-* would also match schedlock-sidecar's archives.
  for f in "$CACHE/$name"-????????????.oci.tar; do
    if [[ -e "$f" && "$f" != "$keep" ]]; then rm -f "$f"; fi
  done
  while read -r img; do
    if [[ -n "$img" && "$img" != "$current" ]]; then bah rmi "$img" >/dev/null 2>&1 || true; fi
  done < <(bah images --format '{{.Name}}:{{.Tag}}' 2>/dev/null | grep -F "${current%:*}:" || true)
  bah rmi --prune >/dev/null 2>&1 || true
}

# What the host's pip uses to reach the package index (the CA bundle it trusts, a mirror, a
# timeout), as a pip.conf for the builds: the environment first (PIP_*), then pip's config files.
host_pip_setting() {
  local key var value=""
  for key in "$@"; do
    var="PIP_${key^^}"
    var="${var//-/_}"
    value="${!var:-}"
    [[ -n "$value" ]] && break
    value="$(python3 -m pip config get "global.$key" 2>/dev/null || true)"
    [[ -n "$value" ]] && break
  done
  printf '%s' "$value"
}

# build_mounts: `-v` options giving RUN steps the host's pip settings.  The CA bundle goes to
# /run/host-ca.crt, not over the image's own bundle path (NODE.md: that broke apt-get in builds),
# and a pip.conf naming it goes to /etc/pip.conf, which every pip reads, the official image's
# included: the Dockerfile stays as users run it.
BUILD_MOUNTS=()
build_mounts() {
  local ca conf key value
  ca="$(host_pip_setting cert)"
  [[ -n "$ca" ]] || ca="/etc/ssl/certs/ca-certificates.crt"
  [[ -f "$ca" ]] || die "no CA bundle for pip in builds: $ca is missing"
  conf="$(scratch_dir pip)/pip.conf"
  {
    echo "[global]"
    echo "cert = /run/host-ca.crt"
    for key in index-url extra-index-url trusted-host retries; do
      value="$(host_pip_setting "$key")"
      [[ -n "$value" ]] && echo "$key = $value"
    done
    value="$(host_pip_setting timeout default-timeout)"
    [[ -n "$value" ]] && echo "timeout = $value"
  } >"$conf"
  BUILD_MOUNTS=(-v "$ca:/run/host-ca.crt:ro" -v "$conf:/etc/pip.conf:ro")
}

# ---------------------------------------------------------------------------- recipes

# Runs on the host after the packages are installed, with the rootfs as $1.
#
# The official image's pip, setuptools and wheel are installed by pip, so the Dockerfile's
# `python -m pip uninstall pip setuptools wheel` works there; Debian's dpkg-owned python3-pip
# refuses that (EXTERNALLY-MANAGED, and pip cannot uninstall files dpkg owns).  So the base
# gets a venv at /usr/local made by Debian's own ensurepip (offline, from the python3-pip-whl
# and python3-setuptools-whl wheels python3-venv depends on), plus wheel from
# python3-wheel-whl: /usr/local/bin/{python,python3,pip} come first on PATH, as in the official
# image, and pip owns what it installed.  A venv made from it (`python -m venv`) is based on
# /usr/bin/python3.11, so the schedlock venv keeps working after pip is removed from /usr/local.
base_customize() {
  local root="$1"
  local run=(chroot "$root" env -i PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin
    LANG=C.UTF-8 HOME=/root)
  "${run[@]}" python3 -m venv /usr/local
  "${run[@]}" sh -c 'exec /usr/local/bin/python -m pip install --quiet --no-index \
    --no-cache-dir --disable-pip-version-check /usr/share/python-wheels/wheel-*.whl'
  "${run[@]}" dpkg --purge python3-wheel-whl >/dev/null
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
    "$root"/var/log/*.log "$root"/var/log/apt/* "$root"/root/.cache
  # mmdebstrap copies the host's: the runtime provides both per container.
  rm -f "$root/etc/resolv.conf" "$root/etc/hostname"
}

build_base() {
  local ref="$1" out="$2" dir
  dir="$(scratch_dir base)"
  # mmdebstrap runs the hook as a program with the rootfs as its argument.
  {
    echo '#!/usr/bin/env bash'
    echo 'set -euo pipefail'
    declare -f base_customize
    # shellcheck disable=SC2016 # "$1" is for the hook script to expand, not this one
    echo 'base_customize "$1"'
  } >"$dir/customize.sh"
  chmod +x "$dir/customize.sh"
  log "base: mmdebstrap $SUITE minbase + ${BASE_PACKAGES[*]} (first time about a minute)"
  local include
  include="$(IFS=,; echo "${BASE_PACKAGES[*]},python3-wheel-whl")"
  # The merged-usr hook makes the /bin -> usr/bin links itself, as debootstrap (and so the
  # official images) do; without it apt merges /usr with the usrmerge package and pulls in
  # perl (50 MB).
  mmdebstrap --quiet --variant=minbase --mode=root --format=tar --include="$include" \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --aptopt='Acquire::Languages "none"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --customize-hook="$dir/customize.sh" \
    "$SUITE" - \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" \
    "deb $SECURITY_MIRROR $SUITE-security main" 2>"$dir/mmdebstrap.log" |
    # A container's /dev comes from the runtime: no device nodes in the layer.
    mmtarfilter --path-exclude='/dev/*' >"$dir/rootfs.tar" ||
    { tail -n 40 "$dir/mmdebstrap.log" >&2; die "mmdebstrap failed (log above)"; }

  log "base: importing the rootfs into buildah"
  local ctr
  ctr="$(bah from --pull=never scratch)"
  CONTAINERS+=("$ctr")
  bah add --quiet "$ctr" "$dir/rootfs.tar" /
  bah config \
    --env PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 \
    --cmd python3 \
    --label org.opencontainers.image.title="python-3.11-slim-$SUITE (Debian packages)" \
    --label org.opencontainers.image.description="Debian $SUITE python3 with pip in a venv at /usr/local, standing in for python:3.11-slim-$SUITE" \
    "$ctr"
  bah commit --quiet --rm "$ctr" "$ref" >/dev/null
  CONTAINERS=()
  # What the Dockerfile relies on, checked in a throwaway container (a `buildah run` leaves
  # mount points such as /etc/hosts behind in the container it runs in).
  ctr="$(bah from --pull=never "$ref")"
  CONTAINERS+=("$ctr")
  bah run "$ctr" -- sh -euc '
    python --version
    python -m pip --version
    python -m venv --without-pip /tmp/check-venv
    /tmp/check-venv/bin/python -c "import ssl, sqlite3, zoneinfo; zoneinfo.ZoneInfo(\"Europe/Paris\")"' >&2
  bah rm "$ctr" >/dev/null
  CONTAINERS=()
  export_archive "$ref" "$out"
}

# build_dockerfile_target TARGET REF OUT ROOT: one target (stage) of the repo's Dockerfile.
build_dockerfile_target() {
  local target="$1" ref="$2" out="$3" root="$4" revision="unknown" paths head
  load_base
  # The revision label names a commit only when the context is exactly that commit's files.
  mapfile -t paths < <(inputs schedlock "$root")
  head="$(scratch_dir head)"
  if git -C "$REPO" archive HEAD -- "${paths[@]}" 2>/dev/null | tar -C "$head" -xf - 2>/dev/null &&
    [[ "$(tree_hash "$head" "${paths[@]}" 2>/dev/null)" == "$(tree_hash "$root" "${paths[@]}")" ]]; then
    revision="$(git -C "$REPO" rev-parse HEAD)"
  fi
  build_mounts
  log "$target: buildah bud --target $target Dockerfile FROM $(ref base) (pip downloads the dependencies: about a minute)"
  bah bud --quiet --isolation chroot --pull=never --target "$target" \
    --build-arg PYTHON_IMAGE="$(ref base)" \
    --build-arg VERSION="$(version "$root")" \
    --build-arg REVISION="$revision" \
    "${BUILD_MOUNTS[@]}" \
    -f "$root/Dockerfile" -t "$ref" "$root" >/dev/null
  export_archive "$ref" "$out" "$(base_diff_ids)"
  bah rmi "$ref" >/dev/null
}

build_schedlock() { build_dockerfile_target schedlock "$@"; }
build_schedlock_sidecar() { build_dockerfile_target schedlock-sidecar "$@"; }

build_demo_app() {
  local ref="$1" out="$2" root="$3"
  load_base
  log "demo-app: buildah bud examples/demo-app FROM $(ref base)"
  bah bud --quiet --isolation chroot --pull=never \
    --build-arg PYTHON_IMAGE="$(ref base)" \
    -f "$root/examples/demo-app/Containerfile" -t "$ref" "$root/examples/demo-app" >/dev/null
  export_archive "$ref" "$out" "$(base_diff_ids)"
  bah rmi "$ref" >/dev/null
}

# ---------------------------------------------------------------------------- commands

declare -A BUILT=()  # NAME -> the archive this run built or found

ensure_one() {
  local name="$1" root="" out ref start
  [[ -n "${BUILT[$name]:-}" ]] && return 0
  if [[ "$name" != base ]]; then
    ensure_one base
    root="$(scratch_dir "$name")"
    snapshot "$name" "$root"
  fi
  out="$(archive "$name" "$root")"
  ref="$(ref "$name" "$root")"
  if [[ ! -f "$out" ]]; then
    start="$(date +%s)"
    # Leftovers of an interrupted build (only builds of this script use this storage).
    bah rm --all >/dev/null 2>&1 || true
    case "$name" in
      base) build_base "$ref" "$out" ;;
      schedlock) build_schedlock "$ref" "$out" "$root" ;;
      schedlock-sidecar) build_schedlock_sidecar "$ref" "$out" "$root" ;;
      demo-app) build_demo_app "$ref" "$out" "$root" ;;
    esac
    drop_stale "$name" "$out" "$ref"
    log "$name: built $ref in $(($(date +%s) - start)) s: $out ($(du -h "$out" | cut -f1))"
  fi
  BUILT[$name]="$out"
}

ensure() {
  local names=("$@") name
  [[ ${#names[@]} -eq 0 ]] && names=("${NAMES[@]}")
  for name in "${names[@]}"; do key "$name" >/dev/null; done
  setup
  # One build at a time per cache, whoever asks (tests, the cluster helper, a developer).
  exec 9>"$CACHE/.lock"
  flock 9
  for name in "${names[@]}"; do ensure_one "$name"; done
  exec 9>&-
}

# run-step: what a Dockerfile's RUN step does to the host, once: `true` in a throwaway container
# of the base image (tests/integration/test_images.py checks the host is left as it was).
run_step() {
  local ctr
  ensure base
  setup
  exec 9>"$CACHE/.lock"
  flock 9
  load_base
  ctr="$(bah from --pull=never "$(ref base)")"
  bah run "$ctr" -- true
  bah rm "$ctr" >/dev/null
  exec 9>&-
}

cmd="${1:-ensure}"
shift || true
case "$cmd" in
  ensure) ensure "$@" ;;
  run-step) run_step ;;
  path)
    [[ $# -eq 1 ]] || die "usage: hack/images.sh path NAME"
    ensure "$1"
    echo "${BUILT[$1]}" ;;
  ref)
    [[ $# -eq 1 ]] || die "usage: hack/images.sh ref NAME"
    ref "$1" ;;
  *) echo "usage: hack/images.sh ensure [NAME...] | path NAME | ref NAME | run-step" >&2; exit 2 ;;
esac
