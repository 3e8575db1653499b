"""Run a single-shot method on one question: draft, gate, and (if the gate says so) select documents and read.

The draft is reused (DESIGN.md section 1): when the gate says "no", the answer is the draft itself, continued from
where it stopped if it was cut at TARG's k tokens, so the no-retrieval path never decodes the answer twice. When
the gate says "yes", the draft's tokens are counted as overhead in the trace.
"""

from __future__ import annotations

import functools
import math
import numbers
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ragate.backends.base import Backend
from ragate.errors import GateError, ModelNotFoundError, RagateError
from ragate.gates.base import GateDecision
from ragate.gates.registry import get_gate
from ragate.methods import prompts as P
from ragate.methods.needs import require, require_index
from ragate.methods.question import (
    QuestionRun,
    encoder_identity,  # noqa: F401 (re-exported)
)
from ragate.methods.spec import MethodSpec, SelectorSpec
from ragate.methods.trace import Stage, Trace
from ragate.retrieval.types import Hit, Retriever
from ragate.selection.dpr import dpr_ais, fixed_split, merge_by_id, rerank_scores
from ragate.types import GenerationRequest


def run_method(
    spec: MethodSpec,
    question: str,
    lm: Backend,
    retriever: Retriever | None,
    *,
    seed: int = 0,
    dataset: str | None = None,
    progress: Callable[[str], None] | None = None,
    early_exit: bool = True,
    hidden: bool = False,
) -> Trace:
    """Answer ``question`` with ``spec``; ``retriever`` may be None only for methods that never retrieve.

    Dynamic methods (``spec.dynamic``) run :func:`ragate.dynamic.loop.run_dynamic`; ``dataset`` picks their
    few-shot exemplars (single-shot methods ignore it). A method the backend cannot serve (a logprob gate on a
    text-only API) is a :class:`~ragate.errors.CapabilityError`, and one the index cannot serve (DPR-AIS over
    an index without embeddings) an :class:`~ragate.errors.IndexNeedError`, both before any LM call.
    ``progress`` is called with each stage's name as it starts (``ragate ask``'s status line). ``early_exit``: a
    gate whose decision can be settled before its draft ends (TARG's entropy and margin, Eqs. 1-2) stops the
    draft there; decisions and answers are the same as without it, the gate's score of such a draft is a lower
    bound (False: every draft is whole, every score exact). ``hidden``: take the model's hidden state at the direct
    prompt's last token first (where the backend gives it: ``Trace.hidden``), from the prefill the draft or the
    closed-book answer then starts from (a single-shot method's; dynamic methods take none)."""
    require(spec, lm.capabilities, engine=lm.engine)
    if retriever is not None:
        require_index(spec, retriever)
    if spec.route is not None:  # each route answered as its own method, cheapest first (ragate.methods.route)
        from ragate.methods.route import run_route

        def route(s: MethodSpec) -> Trace:
            return run_method(s, question, lm, retriever, seed=seed, dataset=dataset, progress=progress)

        return run_route(spec, question, route)
    if spec.dynamic is not None:
        from ragate.dynamic.loop import run_dynamic

        if progress is not None:
            progress("generate")
        return run_dynamic(spec, question, lm, retriever, dataset=dataset)
    run = QuestionRun(spec, question, lm, retriever, seed=seed, progress=progress, early_exit=early_exit)
    if spec.crag is not None:
        from ragate.methods.crag_lite import run_crag_lite

        return run_crag_lite(run, spec.crag)
    if hidden:
        run.hidden_state()
    decision, documents = _gate_and_select(run)
    if decision.retrieve:
        context = spec.prompts.format_passages([h.passage for h in documents])
        answer = run.one("answer", spec.prompts.with_context, context=context).text
    else:
        answer = run.closed_book_answer()
    answer = spec.prompts.answer_text(answer)
    return Trace(
        spec.name,
        question,
        answer,
        decision.retrieve,
        decision,
        tuple(run.queries),
        documents,
        tuple(run.stages),
        gate_stages=run.gate_stages,
        draft=run.drafted,
        hidden=run.hidden_state() if hidden else None,
    )


def _gate_and_select(run: QuestionRun, select: bool = True) -> tuple[GateDecision, tuple[Hit, ...]]:
    """The gate's decision and, when it says "retrieve" (and ``select``), the documents the method's selector
    keeps (the gate's generations then count as overhead: the reading answer reuses none of them)."""
    spec = run.spec
    decision = run_gate(run, spec)
    run.gate_stages = len(run.stages)
    if not decision.retrieve or not select:
        return decision, ()
    run.stages = [replace(s, overhead=True) for s in run.stages]
    return decision, tuple(_select(run, spec.selector, run.pseudo))


def select_documents(
    spec: MethodSpec,
    question: str,
    lm: Backend,
    retriever: Retriever | None,
    *,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    early_exit: bool = True,
    answer_skipped: bool = False,
    select: bool = True,
) -> Trace:
    """The gate and, when it says "retrieve", the method's selection, with no answer written: what a framework
    that reads the documents with its own model needs (``ragate.integrations``). The trace's ``answer`` is empty
    and its documents are those ``run_method`` would read with the same ``seed`` (``early_exit`` as there).

    ``answer_skipped``: when the gate says "no", write the closed-book answer as :func:`run_method` does (the
    gate's draft, continued where it stopped), so a framework whose model is this one never pays the draft twice.
    ``select=False``: the gate alone, no documents even where it says "retrieve" (a router whose other branch
    searches by itself)."""
    _no_gate_alone(spec)
    require(spec, lm.capabilities, engine=lm.engine)
    if retriever is not None:
        require_index(spec, retriever)
    run = QuestionRun(spec, question, lm, retriever, seed=seed, progress=progress, early_exit=early_exit)
    decision, documents = _gate_and_select(run, select)
    answer = ""
    if answer_skipped and not decision.retrieve:
        answer = spec.prompts.answer_text(run.closed_book_answer())
    return Trace(
        spec.name, question, answer, decision.retrieve, decision, tuple(run.queries), documents,
        tuple(run.stages), gate_stages=run.gate_stages, draft=run.drafted,
    )  # fmt: skip


def _no_gate_alone(spec: MethodSpec) -> None:
    """Dynamic methods, CRAG-lite and route methods have no gate that runs before (and apart from) the answer."""
    if spec.route is not None:
        raise ValueError(
            f"{spec.name!r} routes each question by checking its routes' answers: it has no gate to run before the "
            "answer, so it is not swept or calibrated apart; answer with it (Pipeline.answer, `ragate eval`)"
        )
    if spec.dynamic is not None:
        raise ValueError(
            f"{spec.name!r} is a dynamic method: it decides while generating, so it has no gate to run alone "
            "(sweeps and calibration cover single-shot gates; re-run dynamic methods with `ragate eval`)"
        )
    if spec.crag is not None:
        raise ValueError(
            f"{spec.name!r} retrieves first and grades what it found (CRAG-lite): it has no gate to run alone, "
            "so it is not swept or calibrated; evaluate it with `ragate eval`"
        )


def decide(
    spec: MethodSpec,
    question: str,
    lm: Backend,
    retriever: Retriever | None = None,
    *,
    seed: int = 0,
    stages: list[Stage] | None = None,
) -> GateDecision:
    """Only the gate: its decision and score for ``question`` (what calibration and threshold sweeps need).

    It pays for the gate's own generations and nothing after them, so its score equals the one ``run_method``
    would see with the same ``seed`` and ``early_exit=False``: drafts are never stopped early here, because what
    reads these scores ranks them (threshold sweeps, calibration, AUROC), and an early-exit score is only a lower
    bound. Dynamic methods have no gate to run alone: they decide while writing. ``stages``, if given, receives
    the gate's stages (its LM calls, searches and other steps), as a sweep records what deciding took."""
    _no_gate_alone(spec)
    require(spec, lm.capabilities, engine=lm.engine)
    run = QuestionRun(spec, question, lm, retriever, seed=seed, early_exit=False)
    try:
        return run_gate(run, spec)
    finally:
        if stages is not None:
            stages.extend(run.stages)


def run_gate(run: QuestionRun, spec: MethodSpec) -> GateDecision:
    """The gate's decision for ``run``'s question, checked: a gate that raises (other than ragate's own errors:
    a backend that failed, a capability it lacks) or returns no :class:`GateDecision` with a real, non-NaN score
    (+/-inf is a gate's way of saying "certain") is a :class:`GateError` naming the gate and the question's
    problem, so a user's gate is reported as that gate's failure, not as a traceback from ragate."""
    name = spec.gate.kind
    try:
        decision = get_gate(name).decide(run, spec.gate.tau)
    except RagateError:
        raise
    except Exception as err:
        raise GateError(f"the gate {name!r} failed: {type(err).__name__}: {err}") from err
    return check_decision(name, decision)


def check_decision(name: str, decision: Any) -> GateDecision:
    """``decision`` if it is a :class:`GateDecision` with a bool ``retrieve`` and a real, non-NaN ``score``;
    else a :class:`GateError` saying what the gate returned."""
    if not isinstance(decision, GateDecision):
        raise GateError(
            f"the gate {name!r} returned {type(decision).__name__} {_short(decision)}; a gate's decide() returns a "
            "ragate.GateDecision (or define score() and let the gate compare it with tau)"
        )
    score = decision.score
    if isinstance(score, bool) or not isinstance(score, numbers.Real):
        raise GateError(
            f"the gate {name!r} gave the score {_short(score)} ({type(score).__name__}); a score is a number "
            "(higher: more reason to retrieve)"
        )
    if math.isnan(score):
        raise GateError(
            f"the gate {name!r} gave a NaN score, which no threshold can compare (it would never retrieve): "
            "return a number, or +inf to say 'retrieve for sure'"
        )
    if not isinstance(decision.retrieve, bool | np.bool_):
        raise GateError(f"the gate {name!r} said retrieve = {_short(decision.retrieve)}; it must be True or False")
    return decision


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _select(run: QuestionRun, sel: SelectorSpec, pseudo: str | None) -> list[Hit]:
    q, prompts = run.question, run.spec.prompts
    kind = sel.kind
    if kind == "question":
        return run.search([q], sel.k)[0]
    if kind == "rerank":
        return _rerank_question(run, sel)
    if kind == "hyde":
        return _hyde(run, sel)
    if kind in ("q2d", "cot"):
        template = prompts.pseudo_context if kind == "q2d" else P.COT
        text = run.one(kind, template, max_tokens=run.spec.expansion_max_tokens, overhead=True).text
        return run.search([" ".join([q] * sel.repeats + [text])], sel.k)[0]
    if pseudo is None:
        pseudo = run.one(
            "pseudo-context", prompts.pseudo_context, max_tokens=run.spec.pseudo_max_tokens, overhead=True
        ).text
    retriever = run.need_retriever()
    start = time.perf_counter()
    if kind.startswith("fixed-"):
        a, b = (2, 1) if kind == "fixed-2q1p" else (1, 2)
        hits = fixed_split(retriever, q, pseudo, from_question=a, from_pseudo=b)
    elif kind == "dpr-ais-rerank":
        hits = _rerank(retriever, q, pseudo, sel)
    else:
        paths = {"dpr-ais": "both", "dpr-ais-question": "question", "dpr-ais-pseudo": "pseudo"}[kind]
        kept = dpr_ais(retriever, q, pseudo, n=sel.n, k=sel.k, score=sel.score, paths=paths)  # type: ignore[arg-type]
        hits = [Hit(s.hit.passage, s.score, i + 1) for i, s in enumerate(kept)]
    run.stages.append(Stage("retrieve", 0, 0, time.perf_counter() - start))
    run.queries.extend([q, pseudo])
    return hits


def _hyde(run: QuestionRun, sel: SelectorSpec) -> list[Hit]:
    """HyDE: the mean of the question's and the hypothetical documents' embeddings is the query vector."""
    retriever = run.need_retriever()
    greedy = sel.hyde_samples == 1
    requests = [
        GenerationRequest(
            run.messages(P.HYDE),
            max_tokens=run.spec.expansion_max_tokens,
            top_logprobs=0,
            temperature=0.0 if greedy else 0.7,
            seed=i,
        )
        for i in range(sel.hyde_samples)
    ]
    docs = [g.text for g in run.generate("hyde", requests, overhead=True)]
    start = time.perf_counter()
    vectors = retriever.embed_queries([run.question, *docs])
    query = vectors.mean(axis=0)
    query /= np.linalg.norm(query) or 1.0
    hits = retriever.search_by_vectors(query[None, :], sel.k)[0]
    run.stages.append(Stage("retrieve", 0, 0, time.perf_counter() - start))
    run.queries.extend([run.question, *docs])
    return hits


@functools.lru_cache(maxsize=2)
def load_cross_encoder(path: str) -> Any:
    """A sentence-transformers CrossEncoder giving raw scores (no sigmoid: the PAIRS authors sum logits), loaded
    once per path rather than once per question."""
    import torch
    from sentence_transformers import CrossEncoder

    if not Path(path).expanduser().is_dir():
        raise ModelNotFoundError(
            f"cross-encoder {path!r} is not a local directory: pass the path of a sentence-transformers "
            "CrossEncoder (the Hugging Face Hub is not reachable from here)"
        )
    return CrossEncoder(str(Path(path).expanduser()), device="cpu", activation_fn=torch.nn.Identity())


def _rerank_question(run: QuestionRun, sel: SelectorSpec) -> list[Hit]:
    """PAIRS's Rerank baseline: the question's top ``n`` (10) reordered by the cross-encoder's K(d,q), top k."""
    assert sel.cross_encoder is not None  # require_index checked it before any LM call
    pool = run.search([run.question], sel.n)[0]  # timed as its own "retrieve" stage
    start = time.perf_counter()
    model = load_cross_encoder(sel.cross_encoder)
    scores = model.predict([(run.question, h.passage.contents) for h in pool], show_progress_bar=False)
    run.stages.append(Stage("rerank", 0, 0, time.perf_counter() - start))
    return _top_k(pool, np.asarray(scores), sel.k)


def _top_k(pool: list[Hit], scores: np.ndarray, k: int) -> list[Hit]:
    """The ``k`` hits of ``pool`` with the highest ``scores`` (ties: pool order), ranked 1..k with their scores."""
    order = np.argsort(-scores, kind="stable")[:k]
    return [Hit(pool[i].passage, float(scores[i]), r + 1) for r, i in enumerate(order)]


def _rerank(retriever: Retriever, q: str, pseudo: str, sel: SelectorSpec) -> list[Hit]:
    """PAIRS Eq. 7 over the DPR pool: K is the cross-encoder's raw score (``cross_encoder``, checked before any
    LM call). Without a cross-encoder the bi-encoder sum is ``dpr-ais-sum``."""
    assert sel.cross_encoder is not None
    pool = merge_by_id(*retriever.search([q, pseudo], sel.n))
    texts = [h.passage.contents for h in pool]
    model = load_cross_encoder(sel.cross_encoder)
    kq = model.predict([(q, t) for t in texts], show_progress_bar=False)
    kp = model.predict([(pseudo, t) for t in texts], show_progress_bar=False)
    return _top_k(pool, rerank_scores(np.asarray(kq), np.asarray(kp)), sel.k)
