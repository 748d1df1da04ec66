"""Validate rendered manifests and sbatch scripts without a cluster or network.

Kubernetes kinds are checked against Kubernetes' own OpenAPI-derived JSON schemas, packaged by
``kubernetes-validate``; the PyTorchJob against the schema in ``schemas/`` (transcribed from the Training
Operator's CRD), with each replica's pod template checked as a Kubernetes ``PodTemplate``.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from torchrig.errors import EngineUnavailable, JobFailed

K8S_VERSION = "1.30"  # validate against a Kubernetes release current clusters run


def _kv() -> Any:
    try:
        import kubernetes_validate
    except ImportError as err:  # pragma: no cover - the cluster extra is missing
        raise EngineUnavailable(
            "kubernetes-validate is not installed", hint="pip install 'torchrig[cluster]'"
        ) from err
    return kubernetes_validate


def _pytorchjob_schema() -> dict[str, Any]:
    text = resources.files("torchrig.cluster").joinpath("schemas/pytorchjob-kubeflow-v1.json").read_text()
    return json.loads(text)


def validate_manifest(doc: dict[str, Any]) -> None:
    """Raise JobFailed naming the manifest and the first violation."""
    kv = _kv()
    where = f"{doc.get('kind', '?')}/{doc.get('metadata', {}).get('name', '?')}"
    try:
        if doc.get("kind") == "PyTorchJob":
            import jsonschema

            jsonschema.validate(doc, _pytorchjob_schema())
            for rtype, rspec in doc["spec"]["pytorchReplicaSpecs"].items():
                pod_template = {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {"name": f"{doc['metadata']['name']}-{rtype.lower()}"},
                    "template": rspec["template"],
                }
                kv.validate(pod_template, K8S_VERSION, strict=True)
        else:
            kv.validate(doc, K8S_VERSION, strict=True)
    except Exception as err:  # jsonschema.ValidationError / kubernetes_validate ValidationError
        message = getattr(err, "message", str(err)).splitlines()[0]
        raise JobFailed(f"{where} is not valid: {message}") from err


def validate_all(docs: list[dict[str, Any]]) -> int:
    for doc in docs:
        validate_manifest(doc)
    return len(docs)
