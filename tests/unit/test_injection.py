"""Sidecar injection (pure): who opts in, what is added, idempotence, workloads, signing."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedlock.cli import main
from schedlock.core.settings import SettingError, build, spec_of
from schedlock.core.timings import DEFAULT_LEASE_SECONDS
from schedlock.operator.injection import (
    ANNOTATION_CHECKS,
    CONTAINER_NAME,
    LABEL_INJECTED,
    InjectionConfig,
    ManifestError,
    SecretRef,
    inject_manifest,
    inject_pod,
    parse_signing_secret,
    refusal,
    wants_sidecar,
)
from schedlock.operator.settings import OperatorSettings
from schedlock.sidecar.settings import SidecarSettings

CONFIG = InjectionConfig(image="example/schedlock:1.2.3")
SIGNING = "schedlock.dev/signing-secret"
OPT_IN = {"schedlock.dev/inject": "true"}  # the label


def pod(
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "app-1", "annotations": annotations or {}, "labels": labels or {}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}], **spec},
    }


def opted_in(**annotations: str) -> dict[str, Any]:
    """A pod that asks for the sidecar, with extra annotations (``signing`` is the signing one)."""
    extra = {SIGNING if k == "signing" else k: v for k, v in annotations.items()}
    return pod(extra, {**OPT_IN, "app.kubernetes.io/name": "billing"})


def test_opt_in_by_label_with_target_from_annotation_or_label() -> None:
    assert not wants_sidecar(pod()["metadata"]).inject
    assert not wants_sidecar(pod({}, {"schedlock.dev/inject": "false"})["metadata"]).inject
    by_label = wants_sidecar(pod({}, {**OPT_IN, "app.kubernetes.io/name": "billing"})["metadata"])
    assert by_label.inject and by_label.target == "billing"
    by_annotation = wants_sidecar(
        pod({"schedlock.dev/target": "mail"}, {**OPT_IN, "app.kubernetes.io/name": "billing"})[
            "metadata"
        ]
    )
    assert by_annotation.target == "mail"
    nameless = wants_sidecar(pod({}, OPT_IN)["metadata"])
    assert not nameless.inject and "app.kubernetes.io/name" in nameless.reason


def test_the_label_is_the_opt_in_exactly_as_the_webhook_selects_it() -> None:
    """The chart's objectSelector matches `schedlock.dev/inject: "true"` exactly: the injector
    agrees, so what the webhook is sent and what it injects are the same pods."""
    named = {"app.kubernetes.io/name": "billing"}
    # The opt-in of 0.1, an annotation alone, no longer opts in (and says what to change).
    legacy = wants_sidecar(pod(OPT_IN, named)["metadata"])
    assert not legacy.inject
    assert legacy.reason == (
        "schedlock.dev/inject is a label now: the annotation alone no longer opts in; "
        'add the label schedlock.dev/inject: "true" to the pod (template)'
    )
    assert refusal(pod(OPT_IN, named)["metadata"], CONFIG) == legacy.reason
    # Label and annotation together: the label decides, the annotation is ignored.
    assert wants_sidecar(pod(OPT_IN, {**OPT_IN, **named})["metadata"]).inject
    assert (
        refusal(pod(OPT_IN, {"schedlock.dev/inject": "false", **named})["metadata"], CONFIG) is None
    )
    # A label value the selector would not match is not an opt-in, and is reported.
    for value in ("True", "yes", "1"):
        decision = wants_sidecar(pod({}, {"schedlock.dev/inject": value, **named})["metadata"])
        assert not decision.inject
        assert decision.reason == (
            f'the label schedlock.dev/inject must be "true" exactly (the webhook selects on it), '
            f"got '{value}': not injected"
        )


def test_native_sidecar_with_restricted_security() -> None:
    p = pod(
        {"schedlock.dev/target-url": "http://127.0.0.1:3000/hook"},
        {**OPT_IN, "app.kubernetes.io/name": "billing"},
    )
    changed = inject_pod(p["metadata"], p["spec"], CONFIG)
    assert changed is not None
    meta, spec = changed
    assert meta["labels"][LABEL_INJECTED] == "true"
    [sidecar] = spec["initContainers"]
    assert sidecar["name"] == CONTAINER_NAME and sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == "example/schedlock:1.2.3" and sidecar["args"] == ["sidecar"]
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["SCHEDLOCK_TARGET"]["value"] == "billing"
    assert env["SCHEDLOCK_TARGET_URL"]["value"] == "http://127.0.0.1:3000/hook"
    assert env["SCHEDLOCK_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "schedlock-database",
        "key": "url",
    }
    assert env["SCHEDLOCK_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    security = sidecar["securityContext"]
    assert security["runAsNonRoot"] and not security["allowPrivilegeEscalation"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert (
        security["seccompProfile"] == {"type": "RuntimeDefault"}
        and security["readOnlyRootFilesystem"]
    )
    assert spec["containers"] == p["spec"]["containers"]  # the app is untouched


def test_injection_is_idempotent_and_leaves_others_alone() -> None:
    p = pod({}, {**OPT_IN, "app.kubernetes.io/name": "billing"})
    meta, spec = inject_pod(p["metadata"], p["spec"], CONFIG) or ({}, {})
    assert inject_pod(meta, spec, CONFIG) is None
    plain = pod()
    assert inject_pod(plain["metadata"], plain["spec"], CONFIG) is None


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"])
def test_workload_templates_are_injected(kind: str) -> None:
    template: dict[str, Any] = {
        "metadata": {
            "labels": {**OPT_IN, "app.kubernetes.io/name": "billing"},
        },
        "spec": {"containers": [{"name": "app", "image": "app:1"}]},
    }
    spec: dict[str, Any] = {"template": template}
    if kind == "CronJob":
        spec = {"jobTemplate": {"spec": {"template": template}}}
    out = inject_manifest({"kind": kind, "metadata": {"name": "x"}, "spec": spec}, CONFIG)
    holder = (
        out["spec"]["jobTemplate"]["spec"]["template"]
        if kind == "CronJob"
        else out["spec"]["template"]
    )
    assert holder["spec"]["initContainers"][0]["name"] == CONTAINER_NAME
    assert "initContainers" not in template["spec"]  # the input is not mutated


# --------------------------------------------------------------------------- signing secret


def injected(p: dict[str, Any], config: InjectionConfig = CONFIG) -> dict[str, Any]:
    changed = inject_pod(p["metadata"], p["spec"], config)
    assert changed is not None
    return changed[1]


def sidecar_of(spec: dict[str, Any]) -> dict[str, Any]:
    [sidecar] = [c for c in spec["initContainers"] if c["name"] == CONTAINER_NAME]
    assert isinstance(sidecar, dict)
    return sidecar


def signing_file(sidecar: dict[str, Any]) -> str | None:
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    return env.get("SCHEDLOCK_SIGNING_SECRET_FILE")


def signing_secret(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The ``secret`` of the volume the sidecar mounts, or None when it mounts none."""
    mounts = sidecar_of(spec).get("volumeMounts") or []
    if not mounts:
        return None
    [mount] = mounts
    [volume] = [v for v in spec.get("volumes") or [] if v["name"] == mount["name"]]
    return dict(volume["secret"])


def test_signing_secret_annotation_mounts_one_key_read_only_for_the_sidecar_alone() -> None:
    spec = injected(opted_in(signing="billing-hmac"))
    sidecar = sidecar_of(spec)
    [mount] = sidecar["volumeMounts"]
    assert mount["readOnly"] is True
    assert mount["mountPath"] == "/var/run/secrets/schedlock.dev/signing"
    assert signing_file(sidecar) == "/var/run/secrets/schedlock.dev/signing/signing-secret"
    assert signing_secret(spec) == {
        "secretName": "billing-hmac",
        "items": [{"key": "signing-secret", "path": "signing-secret"}],  # the default key
        "defaultMode": 0o444,  # root-owned without fsGroup: uid 65532 reads it as "other"
    }
    assert spec["containers"] == [{"name": "app", "image": "app:1"}]  # the app mounts nothing

    with_key = signing_secret(injected(opted_in(signing="billing-hmac/hmac.key")))
    assert with_key is not None and with_key["items"] == [
        {"key": "hmac.key", "path": "signing-secret"}
    ]
    # With an fsGroup the kubelet gives the files to that group, which the sidecar is in.
    grouped = opted_in(signing="billing-hmac")
    grouped["spec"]["securityContext"] = {"fsGroup": 2000}
    assert (signing_secret(injected(grouped)) or {})["defaultMode"] == 0o440


def test_no_signing_unless_asked() -> None:
    spec = injected(opted_in())
    assert "volumes" not in spec
    assert "volumeMounts" not in sidecar_of(spec) and signing_file(sidecar_of(spec)) is None


def test_signing_secret_default_from_the_operator_and_the_annotation_overrides_it() -> None:
    config = InjectionConfig(signing_secret=SecretRef("cluster-hmac", "k"))
    assert (signing_secret(injected(opted_in(), config)) or {})["secretName"] == "cluster-hmac"
    own = signing_secret(injected(opted_in(signing="own-hmac"), config)) or {}
    assert own["secretName"] == "own-hmac"
    assert own["items"][0]["key"] == "signing-secret"  # the annotation's own default key
    off = injected(opted_in(signing=""), config)  # an empty annotation opts this pod out
    assert signing_secret(off) is None and signing_file(sidecar_of(off)) is None


def test_operator_setting_and_its_one_line_error() -> None:
    url = {"SCHEDLOCK_DATABASE_URL": "postgresql://u@db/app"}
    unset = build(OperatorSettings, None, url)
    assert unset.injection.signing_secret is None
    empty = build(OperatorSettings, None, {**url, "SCHEDLOCK_SIDECAR_SIGNING_SECRET": ""})
    assert empty.injection.signing_secret is None  # what the chart sets by default
    settings = build(OperatorSettings, None, {**url, "SCHEDLOCK_SIDECAR_SIGNING_SECRET": "h/k"})
    assert settings.injection.signing_secret == SecretRef("h", "k")
    with pytest.raises(SettingError, match=r"SCHEDLOCK_SIDECAR_SIGNING_SECRET: .*not a Secret"):
        build(OperatorSettings, None, {**url, "SCHEDLOCK_SIDECAR_SIGNING_SECRET": "H"})


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("Billing", "'Billing' is not a Secret name"),
        ("billing_hmac", "is not a Secret name"),
        ("-billing", "is not a Secret name"),
        ("billing..hmac", "is not a Secret name"),
        ("a" * 254, "is not a Secret name"),
        ("billing/", "'' is not a Secret key"),
        ("billing/a key", "'a key' is not a Secret key"),
        ("billing/a/b", "'a/b' is not a Secret key"),
        ("billing/..data", "is not a Secret key"),
        ("billing/.", "is not a Secret key"),
    ],
)
def test_bad_signing_secret_is_refused_with_the_reason(value: str, problem: str) -> None:
    p = opted_in(signing=value)
    decision = wants_sidecar(p["metadata"], CONFIG)
    assert not decision.inject
    assert decision.reason.startswith(f"{SIGNING} must be NAME or NAME/KEY of a Secret; ")
    assert problem in decision.reason and decision.reason.endswith(": not injected")
    assert refusal(p["metadata"], CONFIG) == decision.reason  # the webhook's warning
    assert inject_pod(p["metadata"], p["spec"], CONFIG) is None  # never half-applied
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_signing_secret(value)


def test_refusal_speaks_only_for_pods_that_asked() -> None:
    assert refusal(pod()["metadata"], CONFIG) is None
    assert refusal(pod({}, {"schedlock.dev/inject": "false"})["metadata"], CONFIG) is None
    assert refusal(opted_in(signing="ok")["metadata"], CONFIG) is None
    typo = refusal(pod({}, {"schedlock.dev/inject": "yes"})["metadata"], CONFIG)
    assert typo is not None and typo.startswith('the label schedlock.dev/inject must be "true"')
    nameless = refusal(pod({}, OPT_IN)["metadata"], CONFIG)
    assert nameless is not None and nameless.endswith("to name its target: not injected")


def test_signing_injection_is_idempotent_and_never_collides() -> None:
    p = opted_in(signing="billing-hmac")
    p["spec"]["volumes"] = [
        {"name": "schedlock-signing-secret", "emptyDir": {}},
        {"name": "schedlock-signing-secret-2", "configMap": {"name": "x"}},
    ]
    meta, spec = inject_pod(p["metadata"], p["spec"], CONFIG) or ({}, {})
    assert spec["volumes"][:2] == p["spec"]["volumes"]  # the app's volumes, untouched
    assert [v["name"] for v in spec["volumes"]][2:] == ["schedlock-signing-secret-3"]
    assert sidecar_of(spec)["volumeMounts"][0]["name"] == "schedlock-signing-secret-3"
    assert inject_pod(meta, spec, CONFIG) is None  # already injected: nothing added twice
    assert len(p["spec"]["volumes"]) == 2  # the input is not mutated


def test_schedlock_inject_signs_and_warns_on_one_code_path(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = opted_in(), opted_in(signing="Nope")
    bad["metadata"]["name"] = "app-2"
    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump_all([good, bad])))
    assert main(["inject", "--signing-secret", "cluster-hmac/k"]) == 0
    out, err = capsys.readouterr()
    signed, untouched = yaml.safe_load_all(out)
    assert (signing_secret(signed["spec"]) or {})["secretName"] == "cluster-hmac"
    assert "initContainers" not in untouched["spec"]
    assert f"schedlock inject: warning: Pod/app-2: {SIGNING} must be NAME or NAME/KEY" in err
    assert main(["inject", "--signing-secret", "a/b c"]) == 2
    refused = capsys.readouterr().err
    assert "--signing-secret: must be NAME or NAME/KEY of a Secret; 'b c'" in refused


# --------------------------------------------------------------------- readiness check of the app

READY = "schedlock.dev/target-ready-url"


def test_no_ready_annotation_leaves_the_sidecar_default() -> None:
    env = {e["name"] for e in sidecar_of(injected(opted_in()))["env"]}
    assert "SCHEDLOCK_TARGET_READY_URL" not in env  # a TCP connect to the target URL's port
    blank = {e["name"] for e in sidecar_of(injected(opted_in(**{READY: " "})))["env"]}
    assert "SCHEDLOCK_TARGET_READY_URL" not in blank


@pytest.mark.parametrize("value", ["http://127.0.0.1:8080/ready", "tcp://127.0.0.1:8080"])
def test_the_ready_annotation_is_passed_through(value: str) -> None:
    env = {e["name"]: e for e in sidecar_of(injected(opted_in(**{READY: value})))["env"]}
    assert env["SCHEDLOCK_TARGET_READY_URL"]["value"] == value


@pytest.mark.parametrize("value", ["tcp://127.0.0.1", "ftp://x/ready", "/ready", "tcp://h:1/p"])
def test_a_malformed_ready_annotation_means_no_sidecar_and_a_warning(value: str) -> None:
    p = opted_in(**{READY: value})
    decision = wants_sidecar(p["metadata"], CONFIG)
    assert not decision.inject
    assert decision.reason.startswith(READY) and decision.reason.endswith("not injected")
    assert inject_pod(p["metadata"], p["spec"], CONFIG) is None
    assert refusal(p["metadata"], CONFIG) == decision.reason  # the webhook's warning
    warnings: list[str] = []
    inject_manifest(p, CONFIG, warnings)
    assert warnings == [f"Pod/app-1: {decision.reason}"]


# ------------------------------------------------------------------------------- lease timings


def test_the_injected_sidecar_states_only_the_lease_and_its_settings_accept_it() -> None:
    """The sidecar derives its heartbeat from the lease: injection never derives it again."""
    config = InjectionConfig(lease_seconds=5)
    env = {e["name"]: e.get("value") for e in sidecar_of(injected(opted_in(), config))["env"]}
    assert env["SCHEDLOCK_LEASE_SECONDS"] == "5" and "SCHEDLOCK_HEARTBEAT_SECONDS" not in env
    plain = {k: v for k, v in env.items() if v is not None}
    sidecar = build(SidecarSettings, None, {**plain, "SCHEDLOCK_DATABASE_URL": "sqlite:///x.db"})
    assert sidecar.timings.lease_seconds == 5 and sidecar.timings.heartbeat_seconds == 1.5


def test_the_operator_refuses_a_sidecar_lease_the_sidecar_would_refuse() -> None:
    url = {"SCHEDLOCK_DATABASE_URL": "postgresql://u@db/app"}
    assert build(OperatorSettings, None, url).injection.lease_seconds == DEFAULT_LEASE_SECONDS
    with pytest.raises(SettingError, match=r"SCHEDLOCK_SIDECAR_LEASE_SECONDS: .*from 2 to 300"):
        build(OperatorSettings, None, {**url, "SCHEDLOCK_SIDECAR_LEASE_SECONDS": "1"})
    with pytest.raises(ValueError, match="from 2 to 300"):
        InjectionConfig(lease_seconds=1)


# ------------------------------------------------------- malformed manifests and annotations


def inject_stdin(
    text: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    code = main(["inject"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("manifest", "line"),
    [
        (
            "kind: Pod\nmetadata: [a, b]\n",
            "document 1 (Pod): metadata is an array, not an object",
        ),
        (
            "kind: Deployment\nmetadata: {name: web}\nspec: {template: [1]}\n",
            "document 1 (Deployment): spec.template is an array, not an object",
        ),
        (
            "kind: CronJob\nmetadata: {name: c}\nspec: {jobTemplate: {spec: 3}}\n",
            "document 1 (CronJob): spec.jobTemplate.spec is a number, not an object",
        ),
        (
            "kind: Pod\nmetadata: {name: p, annotations: [x]}\n",
            "document 1 (Pod): metadata.annotations is an array, not an object",
        ),
        (
            "kind: Pod\nmetadata: {name: p}\nspec: {containers: [app]}\n",
            "document 1 (Pod): spec.containers[0] is a string, not an object",
        ),
        (
            "kind: Pod\nmetadata: {name: p}\n---\nkind: Job\nspec: {template: {spec: {volumes: 1}}}",
            "document 2 (Job): spec.template.spec.volumes is a number, not an array",
        ),
        (
            "kind: List\nitems: {a: 1}\n",
            "document 1 (List): items is an object, not an array",
        ),
        (
            "kind: List\nitems: [{kind: Pod}, {kind: Pod, metadata: x}]\n",
            "document 1 (List): item 2: metadata is a string, not an object",
        ),
        ("[" * 1200, "the manifests are nested too deep to be read"),
        ("a: " + "9" * 5000, "the manifests hold a value that cannot be read: Exceeds the limit"),
        ("a: 2026-02-30\n", "the manifests hold a value that cannot be read: day is out of range"),
        ("a: [1, 2\n", "the manifests are not YAML: expected ',' or ']', but got '<stream end>'"),
        ("a: b\n\x07", "the manifests are not YAML text: special characters are not allowed at"),
    ],
)
def test_a_malformed_manifest_is_one_line_and_exit_2(
    manifest: str, line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = inject_stdin(manifest, monkeypatch, capsys)
    assert code == 2 and out == "", err
    assert err.count("\n") == 1 and err.startswith("schedlock inject: error: "), err
    assert line in err
    assert "sys.set_int_max_str_digits" not in err


def test_a_manifest_file_that_is_not_utf8_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_bytes(b"kind: Pod\nmetadata: {name: \xff}\n")
    assert main(["inject", "-f", str(manifest)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("schedlock inject: error: the manifests are not YAML text: invalid")
    assert main(["inject", "-f", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read the manifests: No such file or directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("annotations", "says"),
    [
        ({"schedlock.dev/target": "Billing_App"}, "schedlock.dev/target must be a DNS label"),
        ({"schedlock.dev/target-url": "http://127.0.0.1:99999/x"}, "port from 1 to 65535"),
        ({"schedlock.dev/target-url": "abc"}, "schedlock.dev/target-url must be an http://"),
        ({"schedlock.dev/database-secret": "Bad_Secret"}, "must name a Secret (a DNS subdomain)"),
        ({"schedlock.dev/database-secret": " db"}, "schedlock.dev/database-secret must name"),
        ({"schedlock.dev/target-ready-url": "tcp://127.0.0.1"}, "schedlock.dev/target-ready-url"),
        ({SIGNING: "a/b/c"}, "schedlock.dev/signing-secret must be NAME or NAME/KEY"),
        # A typo of a known annotation would deliver to the default URL unnoticed: refused.
        (
            {"schedlock.dev/target-ulr": "http://127.0.0.1:3000/"},
            "'schedlock.dev/target-ulr' is not an annotation schedlock reads (it reads "
            "schedlock.dev/database-secret, schedlock.dev/signing-secret, schedlock.dev/target, "
            "schedlock.dev/target-ready-url, schedlock.dev/target-url): not injected",
        ),
    ],
)
def test_an_annotation_the_sidecar_would_refuse_means_no_sidecar(
    annotations: dict[str, str], says: str
) -> None:
    """A sidecar that would exit 2 at start (or a pod the API server refuses) is never made:
    the webhook and `schedlock inject` warn instead."""
    p = opted_in(**annotations)
    reason = refusal(p["metadata"], CONFIG)
    assert reason is not None and says in reason and reason.endswith("not injected")
    assert inject_pod(p["metadata"], p["spec"], CONFIG) is None


def test_every_annotation_is_checked_by_the_parser_of_the_setting_it_becomes() -> None:
    """One path for every annotation: the sidecar's own parser for the variable it is injected
    as, so the injector and the sidecar can never disagree about a value."""
    becomes = {
        "schedlock.dev/target": "target",
        "schedlock.dev/target-url": "target_url",
        "schedlock.dev/target-ready-url": "target_ready_url",
    }
    for annotation, name in becomes.items():
        assert ANNOTATION_CHECKS[annotation] is spec_of(SidecarSettings, name).parse
    assert ANNOTATION_CHECKS[SIGNING] is parse_signing_secret
    assert set(ANNOTATION_CHECKS) == {
        *becomes,
        SIGNING,
        "schedlock.dev/database-secret",
    }
    # Left beside the label, the old opt-in annotation is ignored, not refused as unknown.
    assert wants_sidecar(opted_in(**{"schedlock.dev/inject": "true"})["metadata"]).inject
    # Other prefixes are the app's business.
    assert wants_sidecar(opted_in(**{"example.com/schedlock.dev-x": "1"})["metadata"]).inject


def test_a_label_target_the_sidecar_would_refuse_means_no_sidecar() -> None:
    p = pod({}, {**OPT_IN, "app.kubernetes.io/name": "x" * 64})
    assert (refusal(p["metadata"], CONFIG) or "").startswith("app.kubernetes.io/name must be")


def test_a_warning_with_control_characters_is_escaped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = opted_in(**{"schedlock.dev/target": "x\x1b[31m"})
    p["metadata"]["name"] = "evil\nname"
    code, _, err = inject_stdin(yaml.safe_dump(p), monkeypatch, capsys)
    assert code == 0 and err.count("\n") == 1 and "\x1b" not in err
    assert err.startswith("schedlock inject: warning: Pod/evil name: schedlock.dev/target")


SCALARS = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
SHAPES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "metadata",
                    "spec",
                    "template",
                    "jobTemplate",
                    "annotations",
                    "labels",
                    "name",
                    "containers",
                    "initContainers",
                    "volumes",
                    "securityContext",
                    "items",
                    "kind",
                ]
            )
            | st.text(max_size=4),
            inner,
            max_size=5,
        )
    ),
    max_leaves=12,
)
ANNOTATION_VALUES = (
    st.sampled_from(["true", "True", "", "billing", "Bad_Name", "http://h:99999/", "n/k", "a b"])
    | SCALARS
)


@st.composite
def manifests(draw: st.DrawFn) -> dict[str, Any]:
    """A Pod, workload or List whose fields are any shape, and whose annotations any value."""
    kind = draw(st.sampled_from(["Pod", "Deployment", "CronJob", "Job", "List", "Service", None]))
    doc: dict[str, Any] = {
        "kind": kind,
        **draw(st.dictionaries(st.sampled_from(["metadata", "spec", "items"]), SHAPES, max_size=3)),
    }
    if draw(st.booleans()):  # opted in, so the annotation parsing is reached
        annotations = draw(
            st.dictionaries(
                st.sampled_from(
                    [
                        "schedlock.dev/inject",
                        "schedlock.dev/target",
                        "schedlock.dev/target-url",
                        "schedlock.dev/target-ready-url",
                        "schedlock.dev/database-secret",
                        SIGNING,
                        "schedlock.dev/target-ulr",  # unknown: refused, never a crash
                    ]
                ),
                ANNOTATION_VALUES,
                max_size=6,
            )
        )
        template = {"metadata": {"annotations": annotations, "labels": OPT_IN}}
        if kind == "Pod":
            doc["metadata"] = template["metadata"]
        else:
            doc["spec"] = {"template": template, "jobTemplate": {"spec": {"template": template}}}
    return doc


@settings(max_examples=150, deadline=None)
@given(manifests())
def test_any_manifest_is_injected_passed_through_or_a_manifest_error(doc: dict[str, Any]) -> None:
    """The injector's only failure on any shape is ManifestError (schedlock inject: exit 2)."""
    try:
        result = inject_manifest(doc, CONFIG, [])
    except ManifestError as exc:
        error: str | None = str(exc)
    else:
        error = None
    if error is not None:
        assert "\n" not in error
        return
    yaml.safe_dump(result)  # what schedlock inject writes back
    for sidecar in added_sidecars(result):  # each one starts: its settings are valid
        env = {e["name"]: e["value"] for e in sidecar["env"] if "value" in e}
        env.pop("SCHEDLOCK_SIGNING_SECRET_FILE", None)  # mounted in the pod, not here
        build(SidecarSettings, None, {**env, "SCHEDLOCK_DATABASE_URL": "sqlite:///x.db"})


def added_sidecars(tree: Any) -> list[dict[str, Any]]:
    """Every container named like the sidecar with its args, anywhere in ``tree``."""
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("name") == CONTAINER_NAME and node.get("args") == ["sidecar"]:
                found.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(max_size=120) | manifests().map(yaml.safe_dump))
def test_any_input_to_schedlock_inject_is_exit_0_or_2_in_one_line(
    text: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = inject_stdin(text, monkeypatch, capsys)
    assert code in (0, 2), err
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("schedlock inject: error: "), err


@pytest.mark.parametrize("schema", ["schedlock", "jobs"])
def test_injected_sidecars_use_the_operators_database_schema(schema: str) -> None:
    env = {"SCHEDLOCK_DATABASE_URL": "postgresql://db/app", "SCHEDLOCK_DATABASE_SCHEMA": schema}
    config = build(OperatorSettings, None, env).injection
    metadata = {"name": "app-1", "labels": {**OPT_IN, "app.kubernetes.io/name": "billing"}}
    changed = inject_pod(metadata, {"containers": [{"name": "app", "image": "app:1"}]}, config)
    assert changed is not None
    [sidecar] = changed[1]["initContainers"]
    given = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert given["SCHEDLOCK_DATABASE_SCHEMA"] == schema
    sidecar_env = {k: v for k, v in given.items() if v is not None}
    sidecar_env["SCHEDLOCK_DATABASE_URL"] = env["SCHEDLOCK_DATABASE_URL"]  # from its Secret
    assert build(SidecarSettings, None, sidecar_env).database_schema == schema
