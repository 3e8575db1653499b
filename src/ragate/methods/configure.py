"""A method's recipe changed by the arguments of ``ragate ask``/``serve`` and :class:`ragate.Pipeline`: another
gate or selector, a label set or weights file, an answer length, a number of documents, a cross-encoder or another
prompt set, each checked before any cost."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ragate.errors import RagateError
from ragate.methods.spec import MethodSpec


def configure_method(
    spec: MethodSpec,
    gate: str | None,
    selector: str | None,
    skr_labels: str | Path | None,
    max_tokens: int | None,
    k: int | None,
    *,
    cross_encoder: str | Path | None = None,
    prompts: str | None = None,
    gate_weights: str | Path | None = None,
    proxy_model: str | None = None,
    routes: Sequence[str] | None = None,
) -> MethodSpec:
    """``spec`` with another gate or selector, SKR's label set, a trained gate's weights (``ragate gate fit``), a
    proxy gate's small model (``proxy_model``: a model name or GGUF path), an
    answer length, a number of documents, the cross-encoder a rerank selector reads or another prompt set (a name of
    ``ragate.methods.prompts.PROMPT_SETS``, e.g. ``targ`` for TARG's reader with the documents first); a rerank
    selector without a cross-encoder is an error here, before any cost."""
    from ragate.gates.registry import get_gate
    from ragate.methods.needs import require_reranker
    from ragate.methods.spec import RERANK_SELECTORS, SELECTORS, GateSpec

    if gate is not None:
        get_gate(gate)  # an unknown name fails here, with "did you mean"
        spec = spec.with_(gate=GateSpec(gate))
    if selector is not None:
        if selector not in SELECTORS:
            import difflib

            close = difflib.get_close_matches(selector, SELECTORS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise RagateError(f"unknown selector {selector!r}.{hint} Choose one of: {', '.join(SELECTORS)}")
        spec = spec.with_(selector=replace(spec.selector, kind=selector))
    if skr_labels is not None:
        if spec.gate.kind != "skr":
            raise RagateError(f"--skr-labels goes with the skr gate (--method skr), not {spec.name!r}")
        spec = spec.with_(gate=replace(spec.gate, labels=str(skr_labels)))
    if gate_weights is not None:
        if not get_gate(spec.gate.kind).reads_weights:
            raise RagateError(
                f"--gate-weights goes with a trained gate (--method no-model-lr or learned), not {spec.gate.kind!r}"
            )
        spec = spec.with_(gate=replace(spec.gate, weights=str(gate_weights)))
    if proxy_model is not None:
        if not getattr(get_gate(spec.gate.kind), "drafts_with_proxy", False):
            raise RagateError(
                f"--proxy-model goes with a proxy gate (--method proxy-margin or proxy-entropy), not {spec.gate.kind!r}"
            )
        spec = spec.with_(gate=replace(spec.gate, proxy=str(proxy_model)))
    if max_tokens is not None and max_tokens < 1:
        raise RagateError(f"max_tokens must be at least 1, got {max_tokens}")
    if k is not None and k < 1:
        raise RagateError(f"k must be at least 1, got {k}")
    spec = spec.with_limits(max_tokens, k)
    if cross_encoder is not None:
        if spec.selector.kind not in RERANK_SELECTORS or spec.dynamic is not None:
            raise RagateError(
                f"a cross-encoder goes with the selectors {', '.join(RERANK_SELECTORS)} (e.g. --method dpr-ais-rerank), "
                f"not {spec.name!r}"
            )
        spec = spec.with_(selector=replace(spec.selector, cross_encoder=str(cross_encoder)))
    if prompts is not None:
        from ragate.methods.prompts import PROMPT_SETS

        if prompts not in PROMPT_SETS:
            raise RagateError(f"unknown prompt set {prompts!r}; choose one of {', '.join(PROMPT_SETS)}")
        if spec.dynamic is not None:
            raise RagateError(
                f"{spec.name!r} is a dynamic method: it writes with its few-shot exemplars, not a prompt set"
            )
        spec = spec.with_(prompts=PROMPT_SETS[prompts])
    if routes is not None or spec.route is not None:
        spec = _routed(spec, routes, max_tokens, k)
    require_reranker(spec)
    return spec


def _routed(spec: MethodSpec, routes: Sequence[str] | None, max_tokens: int | None, k: int | None) -> MethodSpec:
    """A route method with the routes given (``routes=``, ``--routes``) and the answer length and documents set
    for every route; the routes checked before any model loads (:func:`ragate.methods.route.check_routes`)."""
    from ragate.methods.route import route_specs

    if spec.route is None:
        raise RagateError(f"routes= goes with method='route', not {spec.name!r}")
    if isinstance(routes, str):
        routes = [r.strip() for r in routes.split(",") if r.strip()]
    route = spec.route
    if routes is not None:
        route = replace(route, routes=tuple(routes), stop_nll=None)
    route = replace(route, max_tokens=max_tokens or route.max_tokens, k=k or route.k)
    route_specs(route)
    return spec.with_(route=route)


def calibrated(
    spec: MethodSpec, cal: Mapping[str, Any], path: object, *, routes_given: bool
) -> tuple[MethodSpec, float | None]:
    """``spec`` and its threshold under a ``ragate calibrate`` file: a gate's tau, or a route method's stop
    threshold per stage with the routes they were tuned on (:func:`ragate.methods.route.with_calibration`; no
    single threshold then)."""
    if cal["method"] == "route":
        from ragate.methods.route import with_calibration

        return with_calibration(spec, cal, path, routes_given=routes_given), None
    return spec, float(cal["tau"])
