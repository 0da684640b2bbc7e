"""deploy_checks.py — the structure checks of deploy/'s files that no Debian tool checks: the
Kubernetes manifests against the part of the Kubernetes API schema they use (every key known, every
value of its type, every volume mounted declared, every port named where it is referred to) and the
Grafana dashboard against Grafana's import format (the datasource input, unique panel ids, grid
positions, queries). Used by test_deploy.py (and its PromQL by test_cluster.py, which runs every
query of the dashboard against a live Prometheus). Standard library and PyYAML (python3-yaml).

Each check returns a list of problems, each naming the file and the path of the field ("[] = ok").
"""
import json
import re

# ---- Kubernetes ---------------------------------------------------------------------------------------
# The schema of the objects the manifests use, as Kubernetes' API reference gives it (apps/v1,
# batch/v1, core/v1): for each type, its fields and their types. A type is a name of this table, a
# scalar ("str", "int", "bool", "intstr", "quantity"), ["list", T] or ["map", T] (string keys).
K8S = {
    "ObjectMeta": {"name": "str", "namespace": "str", "labels": ["map", "str"],
                   "annotations": ["map", "str"]},
    "ConfigMap": {"apiVersion": "str", "kind": "str", "metadata": "ObjectMeta",
                  "data": ["map", "str"]},
    "DaemonSet": {"apiVersion": "str", "kind": "str", "metadata": "ObjectMeta",
                  "spec": "DaemonSetSpec"},
    "DaemonSetSpec": {"selector": "LabelSelector", "template": "PodTemplateSpec",
                      "updateStrategy": "DaemonSetUpdateStrategy", "minReadySeconds": "int",
                      "revisionHistoryLimit": "int"},
    "DaemonSetUpdateStrategy": {"type": "str", "rollingUpdate": "RollingUpdateDaemonSet"},
    "RollingUpdateDaemonSet": {"maxUnavailable": "intstr", "maxSurge": "intstr"},
    "Job": {"apiVersion": "str", "kind": "str", "metadata": "ObjectMeta", "spec": "JobSpec"},
    "JobSpec": {"template": "PodTemplateSpec", "completions": "int", "parallelism": "int",
                "completionMode": "str", "backoffLimit": "int", "activeDeadlineSeconds": "int",
                "ttlSecondsAfterFinished": "int", "selector": "LabelSelector"},
    "LabelSelector": {"matchLabels": ["map", "str"]},
    "PodTemplateSpec": {"metadata": "ObjectMeta", "spec": "PodSpec"},
    "PodSpec": {"containers": ["list", "Container"], "initContainers": ["list", "Container"],
                "volumes": ["list", "Volume"], "hostIPC": "bool", "hostPID": "bool",
                "hostNetwork": "bool", "nodeSelector": ["map", "str"],
                "tolerations": ["list", "Toleration"], "restartPolicy": "str",
                "runtimeClassName": "str", "priorityClassName": "str",
                "terminationGracePeriodSeconds": "int", "serviceAccountName": "str",
                "securityContext": "PodSecurityContext"},
    "PodSecurityContext": {"runAsUser": "int", "runAsGroup": "int", "fsGroup": "int",
                           "supplementalGroups": ["list", "int"]},
    "Toleration": {"key": "str", "operator": "str", "value": "str", "effect": "str"},
    "Container": {"name": "str", "image": "str", "command": ["list", "str"],
                  "args": ["list", "str"], "env": ["list", "EnvVar"],
                  "ports": ["list", "ContainerPort"], "volumeMounts": ["list", "VolumeMount"],
                  "resources": "ResourceRequirements", "securityContext": "SecurityContext",
                  "readinessProbe": "Probe", "livenessProbe": "Probe", "startupProbe": "Probe",
                  "restartPolicy": "str", "imagePullPolicy": "str", "workingDir": "str"},
    "EnvVar": {"name": "str", "value": "str", "valueFrom": "EnvVarSource"},
    "EnvVarSource": {"fieldRef": "ObjectFieldSelector"},
    "ObjectFieldSelector": {"fieldPath": "str", "apiVersion": "str"},
    "ContainerPort": {"name": "str", "containerPort": "int", "protocol": "str", "hostPort": "int"},
    "VolumeMount": {"name": "str", "mountPath": "str", "readOnly": "bool", "subPath": "str"},
    "ResourceRequirements": {"requests": ["map", "quantity"], "limits": ["map", "quantity"]},
    "SecurityContext": {"runAsUser": "int", "runAsGroup": "int", "privileged": "bool",
                        "readOnlyRootFilesystem": "bool", "allowPrivilegeEscalation": "bool"},
    "Probe": {"httpGet": "HTTPGetAction", "exec": "ExecAction", "periodSeconds": "int",
              "failureThreshold": "int", "initialDelaySeconds": "int", "timeoutSeconds": "int",
              "successThreshold": "int"},
    "HTTPGetAction": {"path": "str", "port": "intstr", "scheme": "str"},
    "ExecAction": {"command": ["list", "str"]},
    "Volume": {"name": "str", "configMap": "ConfigMapVolumeSource", "emptyDir": "EmptyDirVolumeSource",
               "hostPath": "HostPathVolumeSource",
               "persistentVolumeClaim": "PersistentVolumeClaimVolumeSource"},
    "ConfigMapVolumeSource": {"name": "str", "defaultMode": "int"},
    "EmptyDirVolumeSource": {"medium": "str", "sizeLimit": "quantity"},
    "HostPathVolumeSource": {"path": "str", "type": "str"},
    "PersistentVolumeClaimVolumeSource": {"claimName": "str", "readOnly": "bool"},
}
K8S_KINDS = {("v1", "ConfigMap"), ("apps/v1", "DaemonSet"), ("batch/v1", "Job")}
REQUIRED = {"Container": ("name", "image"), "Volume": ("name",), "VolumeMount": ("name", "mountPath"),
            "ContainerPort": ("containerPort",), "EnvVar": ("name",),
            "PodSpec": ("containers",), "HostPathVolumeSource": ("path",)}
ENUMS = {("Container", "imagePullPolicy"): ("Always", "IfNotPresent", "Never"),
         ("Container", "restartPolicy"): ("Always",),
         ("PodSpec", "restartPolicy"): ("Always", "OnFailure", "Never"),
         ("ContainerPort", "protocol"): ("TCP", "UDP", "SCTP"),
         ("HostPathVolumeSource", "type"): ("", "DirectoryOrCreate", "Directory", "FileOrCreate",
                                            "File", "Socket", "CharDevice", "BlockDevice"),
         ("EmptyDirVolumeSource", "medium"): ("", "Memory"),
         ("JobSpec", "completionMode"): ("NonIndexed", "Indexed"),
         ("DaemonSetUpdateStrategy", "type"): ("RollingUpdate", "OnDelete"),
         ("Toleration", "operator"): ("Exists", "Equal"),
         ("Toleration", "effect"): ("NoSchedule", "PreferNoSchedule", "NoExecute")}
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _check(v, t, path, out, owner=None, key=None):
    if isinstance(t, list):
        kind, inner = t
        if kind == "list":
            if not isinstance(v, list):
                out.append("%s: a list expected, not %r" % (path, v))
                return
            for i, x in enumerate(v):
                _check(x, inner, "%s[%d]" % (path, i), out)
        else:
            if not isinstance(v, dict):
                out.append("%s: a map expected, not %r" % (path, v))
                return
            for k, x in v.items():
                if not isinstance(k, str):
                    out.append("%s: key %r is not a string" % (path, k))
                _check(x, inner, "%s.%s" % (path, k), out)
        return
    if t == "str":
        if not isinstance(v, str):
            out.append("%s: a string expected, not %r (quote it)" % (path, v))
        elif (owner, key) in ENUMS and v not in ENUMS[(owner, key)]:
            out.append("%s: %r is not one of %s" % (path, v, ENUMS[(owner, key)]))
        return
    if t == "int":
        if not isinstance(v, int) or isinstance(v, bool):
            out.append("%s: an integer expected, not %r" % (path, v))
        return
    if t == "bool":
        if not isinstance(v, bool):
            out.append("%s: true or false expected, not %r" % (path, v))
        return
    if t == "intstr":
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            out.append("%s: an integer or a string expected, not %r" % (path, v))
        return
    if t == "quantity":
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, str) and
                                                              _QUANTITY.match(v))):
            out.append("%s: a quantity (e.g. 500m, 4Gi, 8) expected, not %r" % (path, v))
        return
    fields = K8S[t]
    if not isinstance(v, dict):
        out.append("%s: an object (%s) expected, not %r" % (path, t, v))
        return
    for k, x in v.items():
        if k not in fields:
            out.append("%s: %s has no field %r (known: %s)" % (path, t, k, ", ".join(sorted(fields))))
            continue
        _check(x, fields[k], "%s.%s" % (path, k), out, t, k)
    for k in REQUIRED.get(t, ()):
        if k not in v:
            out.append("%s: %s needs %r" % (path, t, k))


def _pod_checks(spec, path, out):
    vols = [v.get("name") for v in spec.get("volumes", [])]
    if len(set(vols)) != len(vols):
        out.append("%s.volumes: a name is used twice: %s" % (path, vols))
    names = []
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group, [])):
            cp = "%s.%s[%d]" % (path, group, i)
            names.append(c.get("name"))
            ports = {p.get("name") for p in c.get("ports", []) if p.get("name")}
            for p in c.get("ports", []):
                n = p.get("containerPort")
                if isinstance(n, int) and not 1 <= n <= 65535:
                    out.append("%s: containerPort %d is not a port" % (cp, n))
                if p.get("name") and (len(p["name"]) > 15 or not _DNS_LABEL.match(p["name"])):
                    out.append("%s: port name %r is not an IANA service name" % (cp, p["name"]))
            for m in c.get("volumeMounts", []):
                if m.get("name") not in vols:
                    out.append("%s: mounts volume %r, which the pod does not declare"
                               % (cp, m.get("name")))
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str) and port not in ports:
                    out.append("%s.%s: port %r is not a named port of the container"
                               % (cp, probe, port))
            if group == "initContainers" and c.get("restartPolicy") == "Always" and "startupProbe" not in c:
                pass  # a native sidecar may start without a probe
    if len(set(names)) != len(names):
        out.append("%s: a container name is used twice: %s" % (path, names))


def check_k8s(docs, fname):
    """Problems of the YAML documents docs (parsed) of file fname."""
    out = []
    for i, d in enumerate(docs):
        if d is None:
            continue
        path = "%s#%d" % (fname, i)
        kind = (d.get("apiVersion"), d.get("kind")) if isinstance(d, dict) else None
        if kind not in K8S_KINDS:
            out.append("%s: unknown apiVersion/kind %r" % (path, kind))
            continue
        _check(d, d["kind"], path, out)
        name = d.get("metadata", {}).get("name", "")  # required at the top, not in a template
        if not _DNS_LABEL.match(str(name)):
            out.append("%s: metadata.name %r is not a DNS label" % (path, name))
        tmpl = d.get("spec", {}).get("template")
        if tmpl:
            _pod_checks(tmpl.get("spec", {}), path + ".spec.template.spec", out)
            sel = d["spec"].get("selector", {}).get("matchLabels")
            labels = tmpl.get("metadata", {}).get("labels", {})
            if sel and any(labels.get(k) != v for k, v in sel.items()):
                out.append("%s: the selector %s does not select the template's labels %s"
                           % (path, sel, labels))
            ann = tmpl.get("metadata", {}).get("annotations", {})
            if ann.get("prometheus.io/scrape") == "true":
                port = ann.get("prometheus.io/port")
                exposed = {p.get("containerPort") for c in tmpl["spec"].get("containers", []) +
                           tmpl["spec"].get("initContainers", []) for p in c.get("ports", [])}
                if not port or not port.isdigit() or int(port) not in exposed:
                    out.append("%s: prometheus.io/port %r is no container's port %s"
                               % (path, port, sorted(exposed)))
    return out


# ---- Grafana ------------------------------------------------------------------------------------------
PANEL_TYPES = {"row", "stat", "table", "timeseries", "heatmap", "text", "gauge", "bargauge"}
TRANSFORMS = {"convertFieldType", "sortBy", "groupingToMatrix", "organize", "labelsToFields",
              "merge", "reduce", "filterFieldsByName"}


def dashboard_queries(d):
    """Every PromQL expression of the dashboard: (where, expr)."""
    out = []
    for p in d.get("panels", []):
        for t in p.get("targets", []):
            out.append(("panel %r" % p.get("title"), t.get("expr", "")))
    for a in d.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append(("annotation %r" % a.get("name"), a["expr"]))
    for v in d.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if q:
            out.append(("variable %r" % v.get("name"), q))
    return out


def check_dashboard(d, fname):
    """Problems of a dashboard (parsed JSON) in Grafana's import format."""
    out = []
    for k in ("title", "uid", "schemaVersion", "panels", "templating", "annotations", "__inputs"):
        if k not in d:
            out.append("%s: no %r" % (fname, k))
    inputs = {"${%s}" % i.get("name") for i in d.get("__inputs", []) if i.get("type") == "datasource"}
    if not isinstance(d.get("schemaVersion"), int) or d.get("schemaVersion", 0) < 36:
        out.append("%s: schemaVersion %r (Grafana 9 or later: 36+)" % (fname, d.get("schemaVersion")))
    if not re.match(r"^[A-Za-z0-9_-]{1,40}$", str(d.get("uid", ""))):
        out.append("%s: uid %r is not a Grafana uid" % (fname, d.get("uid")))

    def ds_ok(ds, where):
        if ds is None:
            return
        if not isinstance(ds, dict) or ds.get("uid") not in inputs | {"-- Grafana --"}:
            out.append("%s: %s: datasource %r is not one of the dashboard's inputs %s"
                       % (fname, where, ds, sorted(inputs)))

    ids = set()
    occupied = {}
    for p in d.get("panels", []):
        where = "panel %r" % p.get("title")
        if p.get("type") not in PANEL_TYPES:
            out.append("%s: %s: unknown type %r" % (fname, where, p.get("type")))
        if not isinstance(p.get("id"), int) or p["id"] in ids:
            out.append("%s: %s: id %r missing or not unique" % (fname, where, p.get("id")))
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in "hwxy") or g.get("x", 0) + g.get("w", 0) > 24:
            out.append("%s: %s: gridPos %r (24 columns)" % (fname, where, g))
        else:
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    if (x, y) in occupied:
                        out.append("%s: %s overlaps %s at (%d, %d)" % (fname, where, occupied[(x, y)], x, y))
                        break
                    occupied[(x, y)] = where
        ds_ok(p.get("datasource"), where)
        if p.get("type") != "row":
            if not p.get("targets"):
                out.append("%s: %s: no query" % (fname, where))
            refs = [t.get("refId") for t in p.get("targets", [])]
            if len(set(refs)) != len(refs):
                out.append("%s: %s: refIds %s not unique" % (fname, where, refs))
        for t in p.get("targets", []):
            ds_ok(t.get("datasource"), where)
            if not t.get("expr"):
                out.append("%s: %s: a target without expr" % (fname, where))
        for tr in p.get("transformations", []):
            if tr.get("id") not in TRANSFORMS:
                out.append("%s: %s: unknown transformation %r" % (fname, where, tr.get("id")))
    for v in d.get("templating", {}).get("list", []):
        ds_ok(v.get("datasource"), "variable %r" % v.get("name"))
    for a in d.get("annotations", {}).get("list", []):
        ds_ok(a.get("datasource"), "annotation %r" % a.get("name"))
    # Variables used are defined.
    defined = {v.get("name") for v in d.get("templating", {}).get("list", [])}
    for where, expr in dashboard_queries(d):
        for var in re.findall(r"\$([A-Za-z_][A-Za-z0-9_]*)", expr):
            if var not in defined and not var.startswith("__"):
                out.append("%s: %s uses $%s, which no variable defines" % (fname, where, var))
    return out


def load_dashboard(path):
    with open(path) as f:
        return json.load(f)
