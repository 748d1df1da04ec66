"""Validate rendered manifests and sbatch scripts without a cluster or network.

Kubernetes kinds are checked against Kubernetes' own OpenAPI-derived JSON schemas, packaged by
``kubernetes-validate``; the PyTorchJob against the schema in ``schemas/`` (transcribed from the Training
Operator's CRD), with each replica's pod template checked as a Kubernetes ``PodTemplate``; the JobSet
against the openAPIV3Schema extracted from the JobSet CRD (``schemas/jobset-x-k8s-io-v1alpha2.json``, with
its source), the CRD's CEL rules (``x-kubernetes-validations``) evaluated by a CEL engine (cel-python) as the
API server evaluates them on create, its replicatedJobs' templates as Kubernetes ``Job``s, and the checks of
JobSet's admission webhook that need no cluster (generated names, success-policy targets).
"""

from __future__ import annotations

import re
from typing import Any

from torchrig.errors import EngineUnavailable, JobFailed

K8S_VERSION = "1.30"  # validate against a Kubernetes release current clusters run


def _engine(module: str, what: str) -> Any:
    """Import an engine of the ``cluster`` extra, or say which one is missing and how to get it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:  # pragma: no cover - the cluster extra is missing
        raise EngineUnavailable(f"{what} is not installed", hint="pip install 'torchrig[cluster]'") from err


def _kv() -> Any:
    return _engine("kubernetes_validate", "kubernetes-validate")


def _celpy() -> Any:
    return _engine("celpy", "the CEL engine (cel-python)")


def _pytorchjob_schema() -> dict[str, Any]:
    from torchrig.data import packaged

    schema: dict[str, Any] = packaged("torchrig.cluster", "schemas/pytorchjob-kubeflow-v1.json")
    return schema


def jobset_crd() -> dict[str, Any]:
    """The JobSet CRD's extract: ``group``, ``version``, ``kind``, ``source`` and its ``openAPIV3Schema``."""
    from torchrig.data import packaged

    crd: dict[str, Any] = packaged("torchrig.cluster", "schemas/jobset-x-k8s-io-v1alpha2.json")
    return crd


def strict(schema: Any) -> Any:
    """A CRD schema as kubectl's strict field validation applies it: a field an object's schema does not
    name is an error (the API server would otherwise prune it silently)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    preserve = out.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


def _validate_jobset(doc: dict[str, Any], kv: Any) -> None:
    import jsonschema

    crd = jobset_crd()
    expected = f"{crd['group']}/{crd['version']}"
    if doc.get("apiVersion") != expected or doc.get("kind") != crd["kind"]:
        raise ValueError(f"apiVersion/kind must be {expected}/{crd['kind']}")
    if not isinstance(doc.get("metadata", {}).get("name"), str) or not isinstance(doc.get("spec"), dict):
        raise ValueError("a JobSet needs metadata.name and spec")
    jsonschema.validate(doc, strict(crd["openAPIV3Schema"]))
    check_cel_rules(doc, crd["openAPIV3Schema"])
    for rjob in doc["spec"].get("replicatedJobs", []):
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"{doc['metadata']['name']}-{rjob['name']}-0",
                **rjob["template"].get("metadata", {}),
            },
            "spec": rjob["template"]["spec"],
        }
        kv.validate(job, K8S_VERSION, strict=True)
    _jobset_webhook_checks(doc)  # after the schemas: it reads the fields they have checked


_OLD_SELF = re.compile(r"\boldSelf\b")


def cel_rules(schema: dict[str, Any], value: Any, path: str = "") -> list[tuple[str, dict[str, Any], Any]]:
    """Every ``x-kubernetes-validations`` rule of ``schema`` that applies to ``value``: (field path, the rule,
    the value its ``self`` is bound to), walking ``properties``, ``items`` and ``additionalProperties`` as
    the API server does; a field the object does not have is not checked."""
    out = [(path or ".", rule, value) for rule in schema.get("x-kubernetes-validations", [])]
    if isinstance(value, dict):
        for key, sub in value.items():
            child = schema.get("properties", {}).get(key)
            if child is None and isinstance(schema.get("additionalProperties"), dict):
                child = schema["additionalProperties"]
            if child is not None:
                out += cel_rules(child, sub, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, sub in enumerate(value):
            out += cel_rules(schema["items"], sub, f"{path}[{i}]")
    return out


def check_cel_rules(doc: dict[str, Any], schema: dict[str, Any]) -> tuple[int, int]:
    """Evaluate the schema's CEL rules on ``doc`` as on create; ValueError with the rule's message on the first
    that fails. Transition rules (those reading ``oldSelf``) apply only to updates and are skipped, as the API
    server skips them on create. Returns (evaluated, skipped)."""
    celpy = _celpy()
    env = celpy.Environment()
    evaluated = skipped = 0
    for path, rule, value in cel_rules(schema, doc):
        expr = rule["rule"]
        if _OLD_SELF.search(expr):
            skipped += 1
            continue
        try:
            result = env.program(env.compile(expr)).evaluate({"self": celpy.json_to_cel(value)})
        except celpy.CELEvalError as err:
            raise ValueError(f"{path}: the rule {expr!r} could not be evaluated: {err}") from None
        evaluated += 1
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            raise ValueError(f"{path}: {rule.get('message') or expr}")
    return evaluated, skipped


_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _jobset_webhook_checks(doc: dict[str, Any]) -> None:
    """What JobSet's validating webhook rejects on create, where no cluster is needed
    (api/jobset/v1alpha2/jobset_webhook.go, ValidateCreate)."""
    name = doc["metadata"]["name"]
    spec = doc["spec"]
    subdomain = spec.get("network", {}).get("subdomain")
    if subdomain and (len(subdomain) > 63 or not _DNS1035.match(subdomain)):
        raise ValueError(f"network.subdomain {subdomain!r} is not a DNS-1035 label")
    names = [r["name"] for r in spec.get("replicatedJobs", [])]
    for rjob in spec.get("replicatedJobs", []):
        jspec = rjob["template"]["spec"]
        replicas = rjob.get("replicas", 1)
        job_name = f"{name}-{rjob['name']}-{replicas - 1}"
        if len(job_name) > 63 or not _DNS1035.match(job_name):
            raise ValueError(f"generated Job name {job_name!r} is not a DNS-1035 label")
        if jspec.get("completionMode") == "Indexed" and "completions" in jspec:
            pod = f"{job_name}-{jspec['completions'] - 1}-abcde"
            if len(pod) > 63 or not _DNS1035.match(pod):
                raise ValueError(f"generated pod names ({pod!r}) are not DNS-1035 labels of <= 63 characters")
    for target in spec.get("successPolicy", {}).get("targetReplicatedJobs", []):
        if target not in names:
            raise ValueError(f"successPolicy names replicatedJob {target!r}, which is not in replicatedJobs")


def validate_manifest(doc: dict[str, Any]) -> None:
    """Raise JobFailed naming the manifest and the first violation."""
    kv = _kv()
    if doc.get("kind") == "JobSet":
        _celpy()  # a missing engine is said as such, not as an invalid manifest
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
        elif doc.get("kind") == "JobSet":
            _validate_jobset(doc, kv)
        else:
            kv.validate(doc, K8S_VERSION, strict=True)
    except Exception as err:  # jsonschema / kubernetes_validate ValidationError, a webhook check's ValueError
        message = getattr(err, "message", str(err)).splitlines()[0]
        raise JobFailed(f"{where} is not valid: {message}") from err


def validate_all(docs: list[dict[str, Any]]) -> int:
    for doc in docs:
        validate_manifest(doc)
    return len(docs)


def checked_against(kind: str) -> str:
    """What a render of this ``--kind`` was validated against, for the report."""
    extra = {"pytorchjob": " and the PyTorchJob CRD", "jobset": " and the JobSet CRD (v1alpha2)"}
    return f"Kubernetes {K8S_VERSION} schemas" + extra.get(kind, "")
