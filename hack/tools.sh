#!/usr/bin/env bash
# Build or install the pinned test tools into a per-machine cache outside the repo.
#
#   hack/tools.sh ensure [TOOL...]   build/install what is missing (default: all), print progress
#   hack/tools.sh bindir TOOL        print the directory holding TOOL's binaries
#   hack/tools.sh env                print `export` lines that put every tool on PATH
#
# Tools and where they come from:
#   kube-apiserver, kubectl  k8s.io/kubernetes (Go module; a wrapper module pins the staging modules)
#   etcd                     go.etcd.io/etcd/server/v3 (Go module; a wrapper main calls etcdmain)
#   helm                     helm.sh/helm/v3 (Go module)
#   helm-docs                github.com/norwoodj/helm-docs (Go module): the values table of
#                            docs/install.md, from the `# --` comments of values.yaml
#   helm-schema              github.com/losisin/helm-values-schema-json/v2 (Go module): the
#                            chart's values.schema.json, from the `# @schema` comments
#   kubelet, kube-controller-manager, kube-scheduler, kube-proxy
#                            the same k8s.io/kubernetes wrapper module as kube-apiserver
#   coredns                  github.com/coredns/coredns (Go module): the cluster DNS
#   crictl                   sigs.k8s.io/cri-tools (Go module): inspect the node's containers
#   containerd, runc, cni    Debian's `containerd`, `runc`, `containernetworking-plugins`,
#                            `iptables`, `nftables`, `conntrack`: the node's runtime and network
#                            (`nft` is how the test bed removes the tables iptables-nft leaves)
#   buildah, mmdebstrap      Debian's packages: the images, built here from the Dockerfile
#   prometheus, promtool     Debian's `prometheus` package
#   prometheus-upstream      github.com/prometheus/prometheus (Go module): Debian builds its
#                            package without Kubernetes service discovery, which the cluster
#                            tests need to discover the sidecars as a PodMonitor describes them
#   pgbouncer                Debian's `pgbouncer` package
#   checkov                  PyPI, in a virtualenv of its own (its pins clash with the dev tools)
#   river-bench              the benchmark's River worker (bench/peers/river: its go.mod/go.sum pin
#                            github.com/riverqueue/river and its pgx driver), cached by the
#                            content of that directory
#
# KUBEBUILDER_ASSETS (the envtest convention) wins for kube-apiserver/etcd/kubectl when set.
# The cache is keyed by version, so bumping a pin below builds the new version once per machine.
set -euo pipefail

KUBERNETES_VERSION="v1.34.4"
ETCD_VERSION="v3.6.5"
HELM_VERSION="v3.19.0"
HELM_DOCS_VERSION="v1.14.2"
HELM_SCHEMA_VERSION="v2.2.1"
COREDNS_VERSION="v1.14.7"
CRITOOLS_VERSION="v1.34.0"
PROMETHEUS_VERSION="v0.315.1"  # the Go module's version of Prometheus v3.15.1
CHECKOV_VERSION="3.3.30"
# Bump when the build recipe changes (ldflags…): the cache is keyed by version and this revision.
RECIPE="r2"

CACHE="${SCHEDLOCK_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/schedlock/tools}"

log() { printf '[tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

bindir() {
  case "$1" in
    kube-apiserver|kubectl|etcd)
      if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then echo "$KUBEBUILDER_ASSETS"; return; fi
      case "$1" in
        etcd) echo "$CACHE/etcd-$ETCD_VERSION-$RECIPE/bin" ;;
        *) echo "$CACHE/kubernetes-$KUBERNETES_VERSION-$RECIPE/bin" ;;
      esac ;;
    helm) echo "$CACHE/helm-$HELM_VERSION-$RECIPE/bin" ;;
    helm-docs) echo "$CACHE/helm-docs-$HELM_DOCS_VERSION-$RECIPE/bin" ;;
    helm-schema) echo "$CACHE/helm-schema-$HELM_SCHEMA_VERSION-$RECIPE/bin" ;;
    kubelet|kube-controller-manager|kube-scheduler|kube-proxy)
      echo "$CACHE/kubernetes-node-$KUBERNETES_VERSION-$RECIPE/bin" ;;
    coredns) echo "$CACHE/coredns-$COREDNS_VERSION-$RECIPE/bin" ;;
    crictl) echo "$CACHE/crictl-$CRITOOLS_VERSION-$RECIPE/bin" ;;
    prometheus-upstream) echo "$CACHE/prometheus-$PROMETHEUS_VERSION-$RECIPE/bin" ;;
    containerd|ctr|buildah|mmdebstrap) echo "/usr/bin" ;;
    # Debian installs these under sbin (runc has a /usr/bin link, the others do not).
    runc|iptables|nft|conntrack) echo "/usr/sbin" ;;
    cni) echo "/usr/lib/cni" ;;
    prometheus|promtool|pgbouncer) echo "/usr/bin" ;;
    checkov) echo "$CACHE/checkov-$CHECKOV_VERSION/bin" ;;
    river-bench) echo "$CACHE/river-bench-$(river_bench_digest)-$RECIPE/bin" ;;
    *) echo "unknown tool: $1" >&2; return 2 ;;
  esac
}

RIVER_BENCH_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/bench/peers/river"

# river_bench_digest: the content of the River worker's module (its pins and its source).
river_bench_digest() {
  cat "$RIVER_BENCH_SRC/go.mod" "$RIVER_BENCH_SRC/go.sum" "$RIVER_BENCH_SRC"/*.go | sha256sum | cut -c1-12
}

need_go() {
  command -v go >/dev/null || {
    echo "error: Go is needed to build $1 (or point KUBEBUILDER_ASSETS at prebuilt kube-apiserver/etcd/kubectl)" >&2
    exit 2
  }
}

# go_build OUTDIR LABEL GO_MOD_BODY FILENAME:GO_SOURCE LDFLAGS PACKAGE...
go_build() {
  local out="$1" name="$2" gomod="$3" source="$4" ldflags="$5"; shift 5
  local work
  work="$(mktemp -d)"

  printf '%s\n' "$gomod" >"$work/go.mod"
  printf '%s\n' "${source#*:}" >"$work/${source%%:*}"
  (
    cd "$work"
    export GOFLAGS="-mod=mod" CGO_ENABLED=0
    log "$name: resolving modules (first time downloads several hundred MB)"
    go mod tidy >/dev/null 2>"$work/tidy.log" || { cat "$work/tidy.log" >&2; exit 1; }
    mkdir -p "$out.tmp"
    for pkg in "$@"; do
      log "$name: go build $pkg (first time takes minutes)"
      go build -trimpath -ldflags="-s -w $ldflags" -o "$out.tmp/" "$pkg"
    done
  )
  rm -rf "$out" "$work"
  mv "$out.tmp" "$out"
}

# wrapper_gomod NAME MODULE VERSION [EXTRA]: the go.mod of the wrapper module that pins MODULE.
wrapper_gomod() {
  printf 'module schedlock.dev/tools/%s\n\ngo 1.24\n\nrequire %s %s\n%s' "$1" "$2" "$3" "${4:+$'\n'$4}"
}

# tools_go PACKAGE...: tools.go (build tag `tools`) keeps `go mod tidy` resolving what the builds need.
tools_go() {
  printf '//go:build tools\n\npackage tools\n\nimport (\n'
  printf '\t_ "%s"\n' "$@"
  printf ')\n'
}

# go_main MAIN_BODY IMPORT...: main.go of a wrapper whose main calls into the module.
go_main() {
  local body="$1"; shift
  printf 'package main\n\nimport (\n'
  printf '\t%s\n' "$@"
  printf ')\n\nfunc main() { %s }\n' "$body"
}

# have TOOL BINARY...: whether every BINARY is already in TOOL's cache directory.
have() {
  local dir; dir="$(bindir "$1")"; shift
  local bin
  for bin in "$@"; do [[ -x "$dir/$bin" ]] || return 1; done
}

# go_command TOOL MODULE VERSION PACKAGE LDFLAGS: one command of a Go module, built through a
# wrapper module into TOOL's cache directory and named TOOL.
go_command() {
  local tool="$1" module="$2" version="$3" pkg="$4" ldflags="$5"
  have "$tool" "$tool" && return 0
  need_go "$tool"
  local dir; dir="$(bindir "$tool")"
  go_build "$dir" "$tool $version" "$(wrapper_gomod "$tool" "$module" "$version")" \
    "tools.go:$(tools_go "$pkg")" "$ldflags" "$pkg"
  [[ -x "$dir/$tool" ]] || mv "$dir"/* "$dir/$tool"  # the one binary go build named after PACKAGE
}

# kubernetes_build OUTDIR PACKAGE...: k8s.io/kubernetes commands from one wrapper module.
kubernetes_build() {
  local dir="$1"; shift
  need_go "${1##*/}"
  local staging="v0.${KUBERNETES_VERSION#v1.}"
  log "kubernetes $KUBERNETES_VERSION: reading its go.mod to pin the staging modules to $staging"
  local gomodfile
  gomodfile="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  local replaces
  replaces="$(python3 - "$gomodfile" "$staging" <<'EOF2'
import re, sys
text = open(sys.argv[1]).read()
mods = sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", text, re.M)))
print("\n".join(f"replace {m} => {m} {sys.argv[2]}" for m in mods))
EOF2
)"
  # Without these the binaries report v0.0.0 and Helm's kubeVersion checks fail.
  local minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
  local ld="" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  go_build "$dir" "kubernetes $KUBERNETES_VERSION" \
    "$(wrapper_gomod kubernetes k8s.io/kubernetes "$KUBERNETES_VERSION" "$replaces")" \
    "tools.go:$(tools_go "$@")" "$ld" "$@"
}

build_kubernetes() {
  have kube-apiserver kube-apiserver kubectl && return 0
  kubernetes_build "$(bindir kube-apiserver)" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl
}

# The node's components: same module, same pins, same stamps as kube-apiserver (so the build
# cache is shared), in a directory of their own so the API-server-only test bed stays small.
build_kubernetes_node() {
  have kubelet kubelet kube-controller-manager kube-scheduler kube-proxy && return 0
  kubernetes_build "$(bindir kubelet)" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy
}

build_coredns() {
  have coredns coredns && return 0
  need_go coredns
  # CoreDNS's own main package, with the plugin list it ships (kubernetes, forward, cache…).
  go_build "$(bindir coredns)" "coredns $COREDNS_VERSION" \
    "$(wrapper_gomod coredns github.com/coredns/coredns "$COREDNS_VERSION")" \
    "main.go:$(go_main 'coremain.Run()' '_ "github.com/coredns/coredns/core/plugin"' '"github.com/coredns/coredns/coremain"')" \
    "-X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" .
}

build_etcd() {
  have etcd etcd && return 0
  need_go etcd
  # The wrapper module is named …/etcd, so `go build .` names the binary etcd.
  go_build "$(bindir etcd)" "etcd $ETCD_VERSION" \
    "$(wrapper_gomod etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION")" \
    "main.go:$(go_main 'etcdmain.Main(os.Args)' '"os"' '"go.etcd.io/etcd/server/v3/etcdmain"')" "" .
}

build_prometheus_upstream() {
  local ver="${PROMETHEUS_VERSION#v0.}"; ver="3.${ver#3}"
  go_command prometheus-upstream github.com/prometheus/prometheus "$PROMETHEUS_VERSION" \
    github.com/prometheus/prometheus/cmd/prometheus "-X github.com/prometheus/common/version.Version=$ver"
}

build_crictl() {
  go_command crictl sigs.k8s.io/cri-tools "$CRITOOLS_VERSION" sigs.k8s.io/cri-tools/cmd/crictl \
    "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRITOOLS_VERSION"
}

build_helm() {
  # Helm's own Makefile stamps its version and the Kubernetes version it targets.
  local k8sminor="${KUBERNETES_VERSION#v1.}"; k8sminor="${k8sminor%%.*}"
  local ld="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" pkg
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ld+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8sminor"
  done
  go_command helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm "$ld"
}

build_helm_docs() {
  go_command helm-docs github.com/norwoodj/helm-docs "$HELM_DOCS_VERSION" \
    github.com/norwoodj/helm-docs/cmd/helm-docs "-X main.version=$HELM_DOCS_VERSION"
}

build_helm_schema() {
  go_command helm-schema github.com/losisin/helm-values-schema-json/v2 "$HELM_SCHEMA_VERSION" \
    github.com/losisin/helm-values-schema-json/v2 "-X main.Version=$HELM_SCHEMA_VERSION"
}

# The repository's own module, built with its committed go.sum (-mod=readonly: the pins hold).
build_river_bench() {
  have river-bench river-bench && return 0
  need_go river-bench
  local dir; dir="$(bindir river-bench)"
  log "river-bench: go build bench/peers/river (first time downloads River and pgx)"
  mkdir -p "$dir.tmp"
  (cd "$RIVER_BENCH_SRC" && GOFLAGS=-mod=readonly CGO_ENABLED=0 \
    go build -trimpath -ldflags="-s -w" -o "$dir.tmp/river-bench" .)
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
}

install_checkov() {
  local dir; dir="$(bindir checkov)"
  [[ -x "$dir/checkov" ]] && return 0
  log "checkov $CHECKOV_VERSION: installing into its own virtualenv (about a minute)"
  rm -rf "${dir%/bin}"
  python3 -m venv "${dir%/bin}"
  "$dir/pip" install -q --disable-pip-version-check "checkov==$CHECKOV_VERSION" >/dev/null
}

install_debian() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  command -v apt-get >/dev/null || { echo "error: install ${missing[*]} (Debian packages) by hand" >&2; exit 2; }
  local sudo=""
  [[ "$(id -u)" -ne 0 ]] && sudo="sudo"
  log "apt-get install ${missing[*]}"
  $sudo apt-get update -qq >/dev/null
  # policy-rc.d keeps the packages' own services from starting: tests start their own instances.
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  for svc in prometheus pgbouncer containerd; do
    command -v service >/dev/null && $sudo service "$svc" stop >/dev/null 2>&1 || true
  done
}

ensure() {
  local tools=("$@")
  [[ ${#tools[@]} -eq 0 ]] && tools=(kube-apiserver etcd kubectl helm helm-docs helm-schema prometheus pgbouncer checkov river-bench node images)
  for t in "${tools[@]}"; do
    case "$t" in
      kube-apiserver|kubectl)
        if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
          [[ -x "$KUBEBUILDER_ASSETS/$t" ]] || { echo "error: KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no $t" >&2; exit 2; }
        else build_kubernetes; fi ;;
      etcd)
        if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
          [[ -x "$KUBEBUILDER_ASSETS/etcd" ]] || { echo "error: KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no etcd" >&2; exit 2; }
        else build_etcd; fi ;;
      helm) build_helm ;;
      helm-docs) build_helm_docs ;;
      helm-schema) build_helm_schema ;;
      prometheus|promtool) install_debian prometheus ;;
      pgbouncer) install_debian pgbouncer ;;
      checkov) install_checkov ;;
      river-bench) build_river_bench ;;
      kubelet|kube-controller-manager|kube-scheduler|kube-proxy) build_kubernetes_node ;;
      coredns) build_coredns ;;
      crictl) build_crictl ;;
      prometheus-upstream) build_prometheus_upstream ;;
      containerd|ctr|runc|cni|iptables|nft|conntrack)
        install_debian containerd runc containernetworking-plugins iptables nftables conntrack ;;
      buildah|mmdebstrap) install_debian buildah mmdebstrap ;;
      node) ensure kubelet coredns crictl containerd prometheus-upstream ;;
      images) ensure buildah ;;
      *) echo "unknown tool: $t" >&2; exit 2 ;;
    esac
  done
}

env_lines() {
  local dirs=()
  for t in kube-apiserver etcd helm; do dirs+=("$(bindir "$t")"); done
  local path
  path="$(printf '%s:' "${dirs[@]}")"
  echo "export PATH=\"${path}\$PATH\""
}

cmd="${1:-ensure}"
shift || true
case "$cmd" in
  ensure) ensure "$@" ;;
  bindir) bindir "$1" ;;
  env) env_lines ;;
  *) echo "usage: hack/tools.sh ensure [TOOL...] | bindir TOOL | env" >&2; exit 2 ;;
esac
