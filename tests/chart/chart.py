"""The chart rendered by Helm's own engine (helm-python-sdk), and its objects checked the way
an API server would check them."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from k8s.validation import CustomSchema
from kubernetes_validate import utils as kv

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "outbox-dispatcher"
CRD_SOURCE = ROOT / "crds" / "outboxdispatchers.yaml"
CRD_COPY = CHART / "files" / "crds" / "outboxdispatchers.yaml"
RELEASE = "outbox"
NAMESPACE = "outbox-system"
# The oldest Kubernetes the chart supports (Chart.yaml's kubeVersion) and the newest schemas.
OLDEST_KUBERNETES = "1.28"
KUBERNETES_VERSIONS = (OLDEST_KUBERNETES, kv.latest_version())

# Other projects' CRDs: the Prometheus Operator's and KEDA's (see crds/README.md there).
FOREIGN_CRDS = Path(__file__).with_name("crds")

Object = dict[str, Any]


class Rendered:
    """One render: the manifests by template, and the objects in them."""

    def __init__(self, manifests: dict[str, str]) -> None:
        self.manifests = manifests
        self.objects: list[Object] = [
            obj
            for name, text in sorted(manifests.items())
            if name.endswith((".yaml", ".yml"))
            for obj in yaml.safe_load_all(text)
            if obj
        ]

    @property
    def notes(self) -> str:
        return next(text for name, text in self.manifests.items() if name.endswith("NOTES.txt"))

    def of_kind(self, kind: str) -> list[Object]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> Object:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, (
            f"{len(found)} {kind} named {name}: {[o['metadata'] for o in found]}"
        )
        return found[0]

    def hooks(self) -> list[Object]:
        return [o for o in self.objects if "helm.sh/hook" in o["metadata"].get("annotations", {})]


def render(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> Rendered:
    with helm.Chart.load(CHART) as chart:
        return Rendered(chart.render(values=values or {}, name=RELEASE, namespace=namespace))


def crd_schema(crd: Object | None = None) -> CustomSchema:
    crd = crd or yaml.safe_load(CRD_SOURCE.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["storage"]]
    return CustomSchema(version["schema"]["openAPIV3Schema"])


def custom_resource_errors(obj: Object) -> list[str]:
    """What the API server would refuse in an OutboxDispatcher (after pruning and defaults)."""
    obj = copy.deepcopy(obj)
    schema = crd_schema()
    unknown = schema.prune(obj)
    schema.default(obj)
    return [f"{path}: unknown field" for path in unknown] + [
        str(error) for error in schema.validate(obj, None)
    ]


def object_errors(obj: Object) -> list[str]:
    """Every problem the Kubernetes schemas (strict: no unknown fields) or, for the Prometheus
    Operator's and KEDA's kinds, their CRDs' schemas find in one rendered object."""
    kind = obj["kind"]
    if obj["apiVersion"] == "outbox.dev/v1alpha1":
        return [f"{kind} {obj['metadata']['name']}: {e}" for e in custom_resource_errors(obj)]
    if obj["apiVersion"].split("/")[0] in ("monitoring.coreos.com", "keda.sh"):
        return _foreign_errors(obj)
    errors = []
    for version in KUBERNETES_VERSIONS:
        try:
            kv.validate(obj, version, strict=True)
        except kv.ValidationError as exc:
            where = ".".join(map(str, exc.path))
            errors.append(
                f"{kind} {obj['metadata']['name']} (Kubernetes {version}) {where}: {exc.message}"
            )
        except kv.SchemaNotFoundError:
            errors.append(f"{kind} {obj['apiVersion']} does not exist in Kubernetes {version}")
    return errors


def _foreign_errors(obj: Object) -> list[str]:
    """Another project's resource, as a server with its CRDs would take it: unknown fields
    (which a server would prune silently) and every schema violation."""
    schema = _foreign_schemas()[obj["kind"]]
    candidate = copy.deepcopy(obj)
    unknown = schema.prune(candidate)
    schema.default(candidate)
    name = f"{obj['kind']} {obj['metadata']['name']}"
    return [f"{name}: {path}: unknown field" for path in unknown] + [
        f"{name}: {error}" for error in schema.validate(candidate, None)
    ]


@functools.cache
def _foreign_schemas() -> dict[str, CustomSchema]:
    schemas = {}
    for path in sorted(FOREIGN_CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        schemas[crd["spec"]["names"]["kind"]] = crd_schema(crd)
    return schemas
