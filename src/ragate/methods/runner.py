"""Run a single-shot method on one question: draft, gate, and (if the gate says so) select documents and read.

The draft is reused (DESIGN.md section 1): when the gate says "no", the answer is the draft itself, continued from
where it stopped if it was cut at TARG's k tokens, so the no-retrieval path never decodes the answer twice. When
the gate says "yes", the draft's tokens are counted as overhead in the trace.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ragate.backends.base import Backend
from ragate.errors import ModelNotFoundError, RagateError
from ragate.gates import basic, judge, pairs, self_eval, self_rag, skr, targ, ugt, verbal
from ragate.gates.base import GateDecision
from ragate.methods import prompts as P
from ragate.methods.needs import require
from ragate.methods.spec import GateSpec, MethodSpec, SelectorSpec
from ragate.methods.trace import Stage, Trace
from ragate.retrieval.types import Hit, Retriever
from ragate.selection.dpr import dpr_ais, fixed_split, merge_by_id, rerank_scores
from ragate.text import extract_tagged_answer
from ragate.types import Generation, GenerationRequest, Message


class QuestionRun:
    """The mutable bookkeeping of one question (stages, queries); not shared, not kept."""

    def __init__(self, spec: MethodSpec, question: str, lm: Backend, retriever: Retriever | None) -> None:
        self.spec, self.question, self.lm, self.retriever = spec, question, lm, retriever
        self.stages: list[Stage] = []
        self.queries: list[str] = []

    def messages(self, template: str, **fields: str) -> tuple[Message, ...]:
        user = Message("user", template.format(question=self.question, **fields))
        system = self.spec.prompts.system
        return (Message("system", system), user) if system else (user,)

    def generate(
        self, name: str, requests: Sequence[GenerationRequest], *, overhead: bool = False
    ) -> list[Generation]:
        gens = self.lm.generate(requests)
        self.stages.extend(Stage.of(name, g, overhead=overhead) for g in gens)
        return gens

    def one(
        self,
        name: str,
        template: str,
        *,
        max_tokens: int | None = None,
        overhead: bool = False,
        top_logprobs: int = 5,
        **fields: str,
    ) -> Generation:
        request = GenerationRequest(
            self.messages(template, **fields),
            max_tokens=max_tokens or self.spec.max_tokens,
            top_logprobs=min(
                top_logprobs, self.lm.capabilities.top_k
            ),  # what the gate needs is checked first
        )
        return self.generate(name, [request], overhead=overhead)[0]

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        retriever = self.need_retriever()
        start = time.perf_counter()
        hits = retriever.search(queries, k)
        self.stages.append(Stage("retrieve", 0, 0, time.perf_counter() - start))
        self.queries.extend(queries)
        return hits

    def need_retriever(self) -> Retriever:
        if self.retriever is None:
            raise self.spec.no_index()
        return self.retriever


def run_method(
    spec: MethodSpec,
    question: str,
    lm: Backend,
    retriever: Retriever | None,
    *,
    seed: int = 0,
    dataset: str | None = None,
) -> Trace:
    """Answer ``question`` with ``spec``; ``retriever`` may be None only for methods that never retrieve.

    Dynamic methods (``spec.dynamic``) run :func:`ragate.dynamic.loop.run_dynamic`; ``dataset`` picks their
    few-shot exemplars (single-shot methods ignore it). A method the backend cannot serve (a logprob gate on a
    text-only API) is a :class:`~ragate.errors.CapabilityError`, never a silent wrong score."""
    require(spec, lm.capabilities, engine=lm.engine)
    if spec.dynamic is not None:
        from ragate.dynamic.loop import run_dynamic

        return run_dynamic(spec, question, lm, retriever, dataset=dataset)
    run = QuestionRun(spec, question, lm, retriever)
    if spec.crag is not None:
        from ragate.methods.crag_lite import run_crag_lite

        return run_crag_lite(run, spec.crag)
    decision, answer, pseudo = _gate(run, spec.gate, seed)
    documents: tuple[Hit, ...] = ()
    if decision.retrieve:
        run.stages = [replace(s, overhead=True) for s in run.stages]  # the answer reuses none of it
        documents = tuple(_select(run, spec.selector, pseudo))
        context = spec.prompts.format_passages([h.passage for h in documents])
        answer = run.one("answer", spec.prompts.with_context, context=context).text
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
    )


def decide(
    spec: MethodSpec, question: str, lm: Backend, retriever: Retriever | None = None, *, seed: int = 0
) -> GateDecision:
    """Only the gate: its decision and score for ``question`` (what calibration and threshold sweeps need).

    It pays for the gate's own generations and nothing after them, so its score equals the one ``run_method``
    would see with the same ``seed``. Dynamic methods have no gate to run alone: they decide while writing."""
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
    require(spec, lm.capabilities, engine=lm.engine)
    return _gate(QuestionRun(spec, question, lm, retriever), spec.gate, seed, answer=False)[0]


def _gate(
    run: QuestionRun, gate: GateSpec, seed: int, *, answer: bool = True
) -> tuple[GateDecision, str, str | None]:
    """The decision, the answer if no retrieval follows (with ``answer``), and a pseudo-context the selector may
    reuse."""
    prompts, kind = run.spec.prompts, gate.kind
    if kind == "always":
        return basic.always(), "", None
    if kind in ("never", "random"):
        decision = basic.never() if kind == "never" else basic.random_gate(run.question, gate.rate, seed)
        if decision.retrieve or not answer:
            return decision, "", None
        return decision, run.one("answer", prompts.direct).text, None
    if kind == "ugt":
        draft = run.one("draft", prompts.direct)
        return ugt.ugt(draft, gate.tau, compare=gate.compare), draft.text, None
    if kind.startswith("targ-"):
        return _targ(run, gate, seed, answer=answer)
    if kind.startswith("pairs"):
        a1 = run.one("draft", prompts.direct)
        p = run.one("pseudo-context", prompts.pseudo_context, max_tokens=run.spec.pseudo_max_tokens).text
        a2 = run.one("pseudo-answer", prompts.with_context, context=p, overhead=True)
        if kind == "pairs-embedding":
            enc = run.need_retriever()
            v1, v2 = enc.embed_queries(
                [extract_tagged_answer(a1.text) or "-", extract_tagged_answer(a2.text) or "-"]
            )
            decision = pairs.pairs_embedding_agreement(a1.text, a2.text, float(v1 @ v2), threshold=gate.tau)
        else:
            decision = pairs.pairs_agreement(a1.text, a2.text, exclude_numbers=kind == "pairs-exclude-num")
        return decision, a1.text, p
    if kind == "verbal-confidence":
        reply = run.one("verbal", P.VERBAL, max_tokens=verbal.MAX_TOKENS, top_logprobs=0)
        return verbal.verbal_confidence(reply.text, gate.tau), verbal.parse_guess(reply.text), None
    if kind in ("self-eval", "skr"):
        if kind == "self-eval":
            reply = run.one("self-eval", P.SELF_EVAL, max_tokens=self_eval.MAX_TOKENS, overhead=True)
            decision = self_eval.self_eval(reply, gate.tau)
        else:
            decision = _skr(run, gate)
        if decision.retrieve or not answer:
            return decision, "", None
        return decision, run.one("answer", prompts.direct).text, None
    if kind == "self-rag-lite":
        draft = run.one("draft", prompts.direct)
        reply = run.one(
            "reflect",
            P.SELF_RAG_LITE,
            max_tokens=self_rag.MAX_TOKENS,
            overhead=True,
            draft=prompts.answer_text(draft.text) or "(no answer)",
        )
        return self_rag.self_rag_lite(reply, gate.tau), draft.text, None
    if kind == "llm-judge":
        reply = run.one("judge", P.JUDGE, max_tokens=4, overhead=True)
        decision = judge.llm_judge(reply)
        if decision.retrieve or not answer:
            return decision, "", None
        return decision, run.one("answer", prompts.direct).text, None
    raise ValueError(f"unknown gate {kind!r}")


def _skr(run: QuestionRun, gate: GateSpec) -> GateDecision:
    """SKR's kNN vote (gates/skr.py) with the label set the gate names, checked against this index's encoder
    and this model; the question never votes on itself."""
    if gate.labels is None:
        raise RagateError(
            "skr needs a label set of training questions: run `ragate sweep` on a training split, then "
            "`ragate skr fit --sweep DIR --out FILE`, and pass --skr-labels FILE"
        )
    labels = skr.load_labels(gate.labels)
    retriever = run.need_retriever()
    skr.check_encoder(labels, encoder_identity(retriever), "this index")
    skr.check_model(labels, _model_identity(run.lm.model, run.lm.engine))
    start = time.perf_counter()
    share, voters, excluded = skr.vote(
        retriever.embed_queries([run.question])[0], labels, gate.neighbours, exclude=run.question
    )
    run.stages.append(Stage("skr-vote", 0, 0, time.perf_counter() - start, overhead=True))
    return skr.skr_decision(share, gate.tau, voters, excluded)


def encoder_identity(retriever: Retriever) -> dict[str, Any] | None:
    """The identity of the encoder a retriever embeds queries with (dense, or hybrid's dense half), else None."""
    encoder = getattr(retriever, "encoder", None) or getattr(
        getattr(retriever, "dense", None), "encoder", None
    )
    return encoder.identity() if encoder is not None else None


@functools.lru_cache(maxsize=4)
def _model_identity(model: str, engine: str) -> dict[str, Any]:
    from ragate.eval.provenance import model_identity

    return model_identity(model, engine)


def _targ(
    run: QuestionRun, gate: GateSpec, seed: int, *, answer: bool
) -> tuple[GateDecision, str, str | None]:
    prompts = run.spec.prompts
    draft = run.one("draft", prompts.direct, max_tokens=gate.prefix)
    if gate.kind == "targ-variance":
        requests = [
            GenerationRequest(
                run.messages(prompts.direct),
                max_tokens=gate.prefix,
                temperature=gate.sample_temperature,
                seed=seed * 1000 + i,
                top_logprobs=0,
            )
            for i in range(gate.samples)
        ]
        decision = targ.targ_variance(
            run.generate("samples", requests, overhead=True), gate.tau, k=gate.prefix
        )
    elif gate.kind == "targ-entropy":
        decision = targ.targ_entropy(draft, gate.tau, k=gate.prefix)
    else:
        decision = targ.targ_margin(draft, gate.tau, k=gate.prefix, beta=gate.beta)
    text = draft.text
    if not answer:
        return decision, text, None
    if not decision.retrieve and draft.finish_reason == "length" and run.spec.max_tokens > len(draft):
        rest = GenerationRequest(
            run.messages(prompts.direct),
            max_tokens=run.spec.max_tokens - len(draft),
            assistant_prefix=draft.text,
            top_logprobs=0,
        )
        text += run.generate("continue", [rest])[0].text
    return decision, text, None


def _select(run: QuestionRun, sel: SelectorSpec, pseudo: str | None) -> list[Hit]:
    q, prompts = run.question, run.spec.prompts
    kind = sel.kind
    if kind == "question":
        return run.search([q], sel.k)[0]
    if kind == "hyde":
        return _hyde(run, sel)
    if kind in ("q2d", "cot"):
        template = prompts.pseudo_context if kind == "q2d" else P.COT
        text = run.one(kind, template, max_tokens=run.spec.pseudo_max_tokens, overhead=True).text
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
            max_tokens=run.spec.pseudo_max_tokens,
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


def _rerank(retriever: Retriever, q: str, pseudo: str, sel: SelectorSpec) -> list[Hit]:
    """PAIRS Eq. 7 over the DPR pool. With ``cross_encoder`` set, K is that CrossEncoder's raw score; without one
    (none ships in a registry here) the index's bi-encoder cosine stands in, which makes K(d,q) + K(d,p) the
    ``sum`` AIS score."""
    pool = merge_by_id(*retriever.search([q, pseudo], sel.n))
    texts = [h.passage.contents for h in pool]
    if sel.cross_encoder:
        model = load_cross_encoder(sel.cross_encoder)
        kq = model.predict([(q, t) for t in texts], show_progress_bar=False)
        kp = model.predict([(pseudo, t) for t in texts], show_progress_bar=False)
    else:
        qv, pv = retriever.embed_queries([q, pseudo])
        docs = retriever.passage_embeddings([h.id for h in pool])
        kq, kp = docs @ qv, docs @ pv
    scores = rerank_scores(np.asarray(kq), np.asarray(kp))
    order = np.argsort(-scores, kind="stable")[: sel.k]
    return [Hit(pool[i].passage, float(scores[i]), r + 1) for r, i in enumerate(order)]
