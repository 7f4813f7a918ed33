"""Reading a spec from YAML: every problem located at file:line:column with the field path and
a hint, never a traceback; the checks across fields; the warnings."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from reconciler.constants import DEFAULT_SPEC_PATH, SPEC_PATH_ENV
from reconciler.errors import Position, SpecError, SpecProblem, UntrustedTextError, YamlError
from reconciler.fsutil import read_untrusted_text
from reconciler.record import Record
from reconciler.spec.model import REFERENCE_PROFILE_ONLY_FIELDS, Deployment
from reconciler.spec.values import _COMMIT_RE, _DIGEST_RE
from reconciler.yamlpos import LocatedDocument, load_located


class LoadedSpec(Record):
    """A valid spec, where it came from, and warnings that do not block it."""

    deployment: Deployment
    path: str
    warnings: list[SpecProblem]


# A deployment spec is a few kilobytes: the cap keeps a wrong --spec (a log, a disk image)
# from being parsed for minutes.
MAX_SPEC_BYTES = 1024 * 1024


def load_spec(path: str | os.PathLike[str]) -> LoadedSpec:
    """Read, parse and validate a spec file; raise SpecError listing every problem."""
    return parse_spec(read_spec_text(path), str(path))


def read_spec_text(path: str | os.PathLike[str]) -> str:
    """The text of a spec file; a SpecError, located, if it is not a small UTF-8 text file."""
    try:
        return read_untrusted_text(path, what="spec", limit=MAX_SPEC_BYTES)
    except UntrustedTextError as exc:
        hint = exc.hint or f"pass --spec PATH or set ${SPEC_PATH_ENV}; the default is {DEFAULT_SPEC_PATH}"
        raise SpecError([SpecProblem(str(path), exc.line, exc.column, "", exc.message, hint)]) from None


def parse_spec(text: str, filename: str) -> LoadedSpec:
    """Parse and validate spec text; `filename` only labels the problems."""
    try:
        document = load_located(text)
    except YamlError as exc:
        raise SpecError([_problem(filename, exc.mark, exc.path, exc.message, exc.hint)]) from None
    hint = "YAML would silently keep only the last one; remove one of them"
    problems = [_problem(filename, mark, path, "duplicate key", hint) for path, mark in document.duplicates]
    if not isinstance(document.data, dict):
        message = "the spec is empty" if document.data is None else "the spec must be a mapping of keys"
        problems.append(_at(document, filename, (), message, "start from specs/deployment.yaml"))
        raise SpecError(problems)
    try:
        deployment = Deployment.model_validate(document.data)
    except ValidationError as exc:
        problems += [_locate(error, document, filename) for error in exc.errors()]
    else:
        problems += [_at(document, filename, loc, message, hint) for loc, message, hint in cross_check(deployment)]
    if problems:  # always, when the model refused the spec
        raise SpecError(sorted(problems, key=lambda problem: (problem.line, problem.column))) from None
    return LoadedSpec(deployment, filename, _warnings(deployment, document, filename))


Located = tuple[tuple[str | int, ...], str, str]


def cross_check(deployment: Deployment) -> list[Located]:
    """Rules that span several fields; each result is (path, message, hint)."""
    checks = (_check_roles, _check_unique_nodes, _check_ports, _check_front, _check_peer_image)
    return [problem for check in checks for problem in check(deployment)]


def _check_roles(deployment: Deployment) -> Iterator[Located]:
    heads = [index for index, node in enumerate(deployment.nodes) if node.role == "head"]
    if len(heads) != 1:
        where = ("nodes", heads[1], "role") if len(heads) > 1 else ("nodes",)
        yield (
            where,
            f"exactly one node must have role: head, found {len(heads)}",
            "mark the Spark that serves the API as head",
        )
    for index, node in enumerate(deployment.nodes):
        if node.role == "head" and node.model_source is not None:
            yield (
                ("nodes", index, "model_source"),
                "the head always downloads from the Hub",
                "remove model_source from the head",
            )
        if node.role == "head" and node.image_source is not None:
            yield (
                ("nodes", index, "image_source"),
                "the head always pulls the image from its registry (it is every peer's source)",
                "remove image_source from the head",
            )


def _check_unique_nodes(deployment: Deployment) -> Iterator[Located]:
    seen: dict[str, int] = {}
    fabric_ips: dict[str, int] = {}
    locals_: list[int] = []
    for index, node in enumerate(deployment.nodes):
        if seen.setdefault(node.name, index) != index:
            yield (
                ("nodes", index, "name"),
                f"node name '{node.name}' is used twice",
                f"rename one; nodes[{seen[node.name]}] has it",
            )
        ip = node.fabric.ip
        if ip is not None and fabric_ips.setdefault(ip, index) != index:
            yield (
                ("nodes", index, "fabric", "ip"),
                f"fabric ip {ip} is also nodes[{fabric_ips[ip]}]'s",
                "each Spark needs its own fabric address",
            )
        if node.ssh is None:
            locals_.append(index)
    if len(locals_) > 1:
        yield (
            ("nodes", locals_[1]),
            "more than one node has no ssh: (only the machine running the reconciler is local)",
            "add an ssh: target to every remote node",
        )


def _check_front(deployment: Deployment) -> Iterator[Located]:
    api, serving = deployment.api, deployment.serving
    taken = {serving.port: "serving.port (where the front listens)", serving.master_port: "serving.master_port"}
    if api.engine_port in taken:
        yield (
            ("api", "engine_port"),
            f"engine_port {api.engine_port} is also {taken[api.engine_port]}",
            "give rank 0 a port of its own (the default: 18000)",
        )
    tls = api.tls
    if tls is not None and (tls.cert_file is None) != (tls.key_file is None):
        given, missing = ("cert_file", "key_file") if tls.key_file is None else ("key_file", "cert_file")
        yield (
            ("api", "tls", missing),
            f"api.tls has a {given} but no {missing}",
            "give both (your certificate and its key), or neither for a self-signed pair made on the head",
        )
    if not deployment.image.allow_unpinned and not re.search(_DIGEST_RE, api.front_image):
        yield (
            ("api", "front_image"),
            f"front image '{api.front_image}' is not pinned by digest",
            "append @sha256:<digest> (see `docker image inspect --format '{{index .RepoDigests 0}}'`), "
            "or set image.allow_unpinned: true to accept a moving tag",
        )


def _check_peer_image(deployment: Deployment) -> Iterator[Located]:
    """A peer takes the image by its digest: a moving tag has none to pass on or compare."""
    if re.search(_DIGEST_RE, deployment.image.ref):
        return
    for index, node in enumerate(deployment.nodes):
        if node.role == "worker" and deployment.image_source_of(node) == "peer":
            where = ("nodes", index, "image_source") if node.image_source else ("image", "worker_source")
            yield (
                where,
                f"{node.name} takes the image from a peer, which needs image.ref pinned by digest",
                "pin image.ref (@sha256:<digest>), or let this worker pull from the registry (image_source: registry)",
            )
            return


def _check_ports(deployment: Deployment) -> Iterator[Located]:
    serving = deployment.serving
    if serving.port == serving.master_port:
        yield (
            ("serving", "master_port"),
            f"master_port equals the API port {serving.port}",
            "use two different ports (the defaults: 8000 and 29655)",
        )
    sizes = serving.cudagraph.capture_sizes
    limit = serving.max_num_seqs * (serving.speculative.num_speculative_tokens + 1)
    if sizes is not None and max(sizes, default=0) > limit:
        yield (
            ("serving", "cudagraph", "capture_sizes"),
            f"capture size {max(sizes)} exceeds max_num_seqs*(num_speculative_tokens+1) = {limit}",
            "drop the larger sizes or raise max_num_seqs",
        )


def _warnings(deployment: Deployment, document: LocatedDocument, filename: str) -> list[SpecProblem]:
    """A moving revision, and fields the chosen profile never renders: said rather than ignored."""
    found: list[Located] = []
    serving = deployment.serving
    if serving.profile == "upstream":
        found += [
            (
                ("serving", name),
                f"serving.{name} has no effect with profile: upstream",
                "remove it, or use profile: reference (with the default image's vLLM fork) where it is rendered",
            )
            for name in REFERENCE_PROFILE_ONLY_FIELDS
            if name in serving.model_fields_set
        ]
    if not re.match(_COMMIT_RE, deployment.model.revision):
        found.append(
            (
                ("model", "revision"),
                f"model revision '{deployment.model.revision}' is a branch, not a commit",
                "pin the 40-hex commit so every node and every rerun gets the same bytes",
            )
        )
    if serving.port < PRIVILEGED_PORTS:
        found.append(
            (
                ("serving", "port"),
                f"serving.port {serving.port} is below {PRIVILEGED_PORTS}: the front runs without privileges",
                "binding it needs `sysctl net.ipv4.ip_unprivileged_port_start` at or below it on the head; "
                "or use a port from 1024 (the default: 8000)",
            )
        )
    return [_at(document, filename, loc, message, hint) for loc, message, hint in found]


# Ports under this need a privilege on Linux that the front (no capabilities, the key's owner) lacks.
PRIVILEGED_PORTS = 1024


def _at(document: LocatedDocument, filename: str, loc: tuple[str | int, ...], message: str, hint: str) -> SpecProblem:
    return _problem(filename, document.mark_for(loc), loc, message, hint)


def _problem(filename: str, mark: Position, loc: tuple[str | int, ...], message: str, hint: str) -> SpecProblem:
    return SpecProblem(filename, mark.line, mark.column, _render_path(loc), message, hint)


def _render_path(loc: tuple[str | int, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _locate(error: Any, document: LocatedDocument, filename: str) -> SpecProblem:
    """A pydantic error in plain words; the value type's own hint (in its context), else the kind's."""
    loc = _document_path(error["loc"], document)
    kind = error["type"]
    message = error["msg"]
    if kind in _BOUND_ERRORS:
        message = f"{error['input']!r:.80} is out of range: {message[:1].lower()}{message[1:]}"
        hint = "use a value inside the allowed range"
    elif kind == "extra_forbidden":
        message = f"unknown key '{loc[-1]}'"
        allowed = _allowed_keys(loc[:-1])
        import difflib  # only to suggest a name for a misspelt key

        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        suggestion = f"did you mean '{close[0]}'? " if close else ""
        hint = f"{suggestion}allowed keys here: {', '.join(allowed)}"
    elif kind == "missing":
        message = f"required key '{loc[-1]}' is missing"
        hint = "add it; see schemas/deployment.schema.json for its meaning"
    elif kind == "literal_error":
        hint = "use one of the listed values"
    elif kind.endswith(("_type", "_parsing")):
        hint = "check the value's type: quote strings, write numbers without quotes"
    else:
        hint = "see schemas/deployment.schema.json for what this field accepts"
    return _at(document, filename, loc, message, str((error.get("ctx") or {}).get("hint") or hint))


_BOUND_ERRORS = {"greater_than_equal", "less_than_equal", "greater_than", "less_than"}


def _document_path(loc: tuple[str | int, ...], document: LocatedDocument) -> tuple[str | int, ...]:
    """Pydantic's location without the union member names it inserts ('str', 'function-after[...]');
    a part that is a key of the document (`list:` typed by mistake) is kept, whatever it looks like."""
    kept: tuple[str | int, ...] = ()
    for part in loc:
        if not _is_union_tag(part) or (*kept, part) in document.marks:
            kept = (*kept, part)
    return kept


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool", "list", "dict"})


def _allowed_keys(loc: tuple[str | int, ...]) -> list[str]:
    model: Any = Deployment
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if _is_model(model) else None
        if field is None:
            return []
        model = _model_inside(field.annotation)
    return list(model.model_fields) if _is_model(model) else []


def _is_model(candidate: Any) -> bool:
    return isinstance(candidate, type) and issubclass(candidate, BaseModel)


def _model_inside(annotation: Any) -> Any:
    """The model class inside Optional[...] or list[...], if any."""
    if _is_model(annotation):
        return annotation
    if get_origin(annotation) is not None:
        for argument in get_args(annotation):
            found = _model_inside(argument)
            if found is not None:
                return found
    return None
