#!/usr/bin/env bash
# Generate the chart's values.schema.json and the values table of docs/install.md from the
# comments of charts/schedlock/values.yaml; `--check` compares instead of writing (make lint).
#
#   # -- TEXT        a value's description: the table's (helm-docs) and the schema's
#   # @schema K: V   its JSON Schema keywords (helm-values-schema-json), `;`-separated; the
#                    Kubernetes types they reference are in charts/schedlock/schema/kubernetes.json
#
# Every object is closed (additionalProperties: false) unless its annotation says otherwise.
# Both tools are built from their Go modules by hack/tools.sh, pinned there.
set -euo pipefail
cd "$(dirname "$0")/.."

# Overridable so a test can check a spoiled copy.
CHART="${SCHEDLOCK_CHART_DIR:-charts/schedlock}"
DOC="${SCHEDLOCK_INSTALL_DOC:-docs/install.md}"
BEGIN='<!-- values table: generated from charts/schedlock/values.yaml by `bash hack/gen-chart-docs.sh`, do not edit -->'
END='<!-- end of the generated values table -->'

check=false
[[ "${1:-}" == "--check" ]] && check=true

bash hack/tools.sh ensure helm-schema helm-docs
helm_schema="$(bash hack/tools.sh bindir helm-schema)/helm-schema"
helm_docs="$(bash hack/tools.sh bindir helm-docs)/helm-docs"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir "$work/chart" "$work/out"
cp -r "$CHART/Chart.yaml" "$CHART/values.yaml" "$CHART/schema" "$work/chart/"

(
  cd "$work/chart"
  "$helm_schema" --values values.yaml --output values.schema.json --draft 2020 --indent 2 \
    --use-helm-docs --no-additional-properties --bundle --bundle-without-id \
    --schema-root.title "schedlock chart values" >schema.log 2>&1 || { cat schema.log >&2; exit 1; }
  printf '%s\n' '{{ template "chart.valuesTable" . }}' >table.gotmpl
  "$helm_docs" --chart-search-root . --template-files table.gotmpl --output-file table.md \
    --sort-values-order file --log-level warning
)
cp "$work/chart/values.schema.json" "$work/out/values.schema.json"
python3 - "$DOC" "$work/chart/table.md" "$BEGIN" "$END" >"$work/out/install.md" <<'PY'
import sys
doc, table, begin, end = sys.argv[1:]
text = open(doc, encoding="utf-8").read()
head, sep, rest = text.partition(begin + "\n")
_, sep2, tail = rest.partition(end + "\n")
if not sep or not sep2:
    sys.exit(f"{doc}: the markers of the generated values table are missing")
sys.stdout.write(head + begin + "\n" + open(table, encoding="utf-8").read().strip() + "\n" + end + "\n" + tail)
PY

stale=()
for pair in "values.schema.json:$CHART/values.schema.json" "install.md:$DOC"; do
  generated="$work/out/${pair%%:*}" committed="${pair#*:}"
  cmp -s "$generated" "$committed" && continue
  if $check; then
    diff -u "$committed" "$generated" | head -40 >&2 || true
    stale+=("$committed")
  else
    cp "$generated" "$committed"
    echo "wrote $committed"
  fi
done
if [[ ${#stale[@]} -gt 0 ]]; then
  echo "stale: ${stale[*]} (generated from $CHART/values.yaml): run \`bash hack/gen-chart-docs.sh\`" >&2
  exit 1
fi
