"""The dynamic-RAG generation loop shared by ETC, DRAGIN, FLARE, IRCoT, In-Context RALM and TARG's re-check.

Generate; a trigger (:mod:`ragate.methods.triggers`) sees the block written since the last retrieval after every
token; when it fires, decoding stops there (nothing after the hit is computed), the block is cut back to the
trigger's ``keep`` point, a query is formed (:mod:`ragate.dynamic.query`), passages are retrieved, and generation
goes on from the prompt "exemplars + passages + question" with the text so far as the start of the answer. Up to
``max_retrievals`` retrievals (None: no cap, bounded for safety at ``SAFETY_RETRIEVALS`` and recorded when
reached), ``max_tokens`` answer tokens. With ``passages="sentence"`` (the authors' code of DRAGIN and ETC) the
passages serve one sentence, written without the trigger watching, and the prompt is then the question and the
text so far again. With ``settle`` (ETC and DRAGIN) the first sentence over new passages is written unwatched
too, as the authors' code writes it (``simply_generate``, ``get_top_sentence``), so each retrieval buys a
sentence of progress; without it a trigger may fire again at the first word after the cut. The model is loaded
once (the caller's backend).

Work is not redone: the llama.cpp and transformers backends keep their key/value cache between calls, and every
call here extends the previous sequence (the same prompt with a longer answer prefix) except right after a
retrieval, when the prompt changes after the exemplars, which stay cached. Each question starts from a cleared
cache, so its answer does not depend on the question before; through :class:`ragate.Pipeline` or ``ragate eval``
the first prompt then starts from the kept state of an earlier one (the instruction and exemplars every question
shares; :mod:`ragate.backends.prompt_states`), exactly. ``recompute=True`` turns the reuse off and re-runs the whole
sequence at every token: the naive loop, for ``benchmarks/dynamic.py`` only.

The answer: generation stops once a sentence with "the answer is" is finished (or at the end of the reply); if
the output has no such sentence, " So the answer is" is appended and a few tokens more are decoded (DRAGIN's and
ETC's completion step), and the answer is what follows "the answer is".
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from ragate.backends.base import Backend
from ragate.backends.decoding import prefix
from ragate.dynamic.etc import load_stop_words
from ragate.dynamic.prompts import messages
from ragate.dynamic.query import attention_query, masked_query, question_masked_query, span_text
from ragate.dynamic.steps import new_sentence
from ragate.dynamic.triggers import make_trigger
from ragate.gates.base import GateDecision
from ragate.methods.spec import DynamicSpec, MethodSpec
from ragate.methods.trace import DynamicInfo, RetrievalEvent, Stage, Trace
from ragate.methods.triggers import Fire, default_threshold
from ragate.retrieval.types import Hit, Retriever
from ragate.text import extract_answer
from ragate.types import Generation, GenerationRequest

ANSWER_DONE = re.compile(r"answer is\b[^\n]*?(?:[.!?]\s|\n)", re.IGNORECASE)
COMPLETION = " So the answer is"
COMPLETION_TOKENS = 16
STOP = ("\nQuestion:", "\n\n")


@dataclass
class _State:
    """One question's mutable bookkeeping; not shared, not kept."""

    text: str = ""  # the answer so far
    kept_tokens: int = 0
    generated: int = 0
    discarded: int = 0
    documents: list[Hit] = field(default_factory=list)
    read: dict[str, Hit] = field(default_factory=dict)  # every passage shown, by id
    events: list[RetrievalEvent] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    fresh: bool = False  # a triggered retrieval just happened: nothing written over its passages yet


def run_dynamic(
    spec: MethodSpec,
    question: str,
    lm: Backend,
    retriever: Retriever | None,
    *,
    dataset: str | None = None,
    recompute: bool = False,
    stop_words: frozenset[str] | None = None,
) -> Trace:
    """Answer ``question`` with the dynamic method ``spec`` (``spec.dynamic`` set); see the module docstring.

    ``dataset`` picks the few-shot exemplars of the set ``spec.dynamic.exemplars`` names
    (:func:`ragate.dynamic.prompts.exemplars_for`)."""
    d = spec.dynamic
    if d is None:
        raise ValueError(f"method {spec.name!r} is not a dynamic method")
    words = stop_words if stop_words is not None else load_stop_words()
    trigger = make_trigger(d, lm, words)
    if retriever is None and spec.retrieves:
        raise spec.no_index()
    form = _query_form(d, lm)
    state = _State()
    lm.clear_cache()  # the question starts from an empty cache: its answer does not depend on the one before it
    if d.initial:
        _retrieve(state, d, retriever, question, "initial", None)
    first: Fire | None = None
    while state.kept_tokens < d.max_tokens:
        if state.fresh and (d.settle or d.passages == "sentence"):
            state.fresh = False
            if _one_sentence(state, d, lm, question, dataset, recompute, drop=d.passages == "sentence"):
                break
            continue
        active = trigger is not None and _triggered(state) < d.retrieval_bound
        hit: list[Fire] = []
        answered: list[int] = []
        before = state.text

        def watch(
            block: Generation,
            active: bool = active,
            hit: list[Fire] = hit,
            answered: list[int] = answered,
            before: str = before,
        ) -> bool:
            if active and trigger is not None and (fire := trigger.check(block, False)) is not None:
                hit.append(fire)
                return True
            if done := ANSWER_DONE.search(before + block.text, max(0, len(before) - 200)):
                answered.append(done.end() - len(before))
                return True
            return False

        gen = lm.generate_watched(_continuation(state, d, question, dataset), watch, recompute=recompute)
        state.generated += len(gen.tokens)
        if (
            active
            and not hit
            and not answered
            and trigger is not None
            and (fire := trigger.check(gen, True)) is not None
        ):
            hit.append(fire)
        if not hit:
            state.stages.append(Stage.of("generate", gen))
            state.text += gen.text[: answered[0]].rstrip() if answered else gen.text
            state.kept_tokens += len(gen.tokens)
            break
        fire = hit[0]
        first = first or fire
        kept = prefix(gen, fire.keep) if fire.keep else None
        state.stages.append(Stage.of("generate", gen))
        state.discarded += len(gen.tokens) - fire.keep
        query = _query(form, d, lm, question, state.text, gen, fire, words)
        _retrieve(state, d, retriever, query, form, fire)
        state.fresh = True
        state.text += kept.text if kept is not None else ""
        state.kept_tokens += fire.keep
    output = _complete(state, lm, question, dataset, d.exemplars)
    return Trace(
        spec.name,
        question,
        extract_answer(output, "answer-is"),
        bool(state.events),
        _decision(d, first, state),
        tuple(e.query for e in state.events),
        tuple(state.read.values()),
        tuple(state.stages),
        DynamicInfo(
            d.trigger,
            output,
            tuple(state.events),
            state.generated,
            state.discarded,
            d.max_retrievals is None and _triggered(state) >= d.retrieval_bound,
        ),
    )


def _one_sentence(
    state: _State,
    d: DynamicSpec,
    lm: Backend,
    question: str,
    dataset: str | None,
    recompute: bool,
    *,
    drop: bool,
) -> bool:
    """Write one sentence over the passages just retrieved, unwatched (``settle``; the authors' code), then, with
    ``drop`` (``passages="sentence"``), take the passages away. True when the reply ended (an answer sentence, or
    the model stopped)."""
    ended: list[int] = []

    def watch(block: Generation) -> bool:
        if (span := new_sentence(block, False)) is not None:
            ended.append(span[1])
            return True
        return False

    gen = lm.generate_watched(_continuation(state, d, question, dataset), watch, recompute=recompute)
    state.generated += len(gen.tokens)
    state.stages.append(Stage.of("generate", gen))
    kept = prefix(gen, ended[0]) if ended else gen
    state.text += kept.text
    state.kept_tokens += len(kept.tokens)
    if drop:
        state.documents = []
    return not ended or bool(ANSWER_DONE.search(kept.text + " "))


def _continuation(state: _State, d: DynamicSpec, question: str, dataset: str | None) -> GenerationRequest:
    """The request that writes on from the text so far, over the passages now in the prompt."""
    return GenerationRequest(
        messages(question, state.documents, dataset, d.exemplars),
        max_tokens=d.max_tokens - state.kept_tokens,
        assistant_prefix=state.text,
        stop=STOP,
        top_logprobs=5,
    )


def _triggered(state: _State) -> int:
    return sum(1 for e in state.events if e.query_form != "initial")


def _query_form(d: DynamicSpec, lm: Backend) -> str:
    if d.query != "auto":
        return d.query
    return "attention" if lm.capabilities.attentions and hasattr(lm, "token_spans") else "question-masked"


def _query(
    form: str,
    d: DynamicSpec,
    lm: Backend,
    question: str,
    text: str,
    block: Generation,
    fire: Fire,
    stop_words: frozenset[str],
) -> str:
    if form == "attention":
        base = f"{question} {text}"
        upto = block.text[: block.offsets[fire.hit[1] - 1][1]]
        start = len(base) + block.offsets[fire.hit[0]][0]
        return attention_query(lm, base + upto, (start, len(base) + len(upto)), d.top_n, stop_words)
    if form == "question-masked":
        return question_masked_query(block, fire, question, d.mask_below)
    if form == "masked":
        return masked_query(block, fire, question, d.mask_below)
    if form == "sentence":
        return span_text(block, fire.sentence) or question
    if form == "chunk":
        return span_text(block, (0, fire.keep)) or question
    return question


def _retrieve(
    state: _State, d: DynamicSpec, retriever: Retriever | None, query: str, form: str, fire: Fire | None
) -> None:
    assert retriever is not None
    start = time.perf_counter()
    hits = retriever.search([query], d.k)[0]
    state.stages.append(Stage("retrieve", 0, 0, time.perf_counter() - start))
    if d.accumulate:
        merged = {h.id: h for h in [*state.documents, *hits]}
        state.documents = list(merged.values())[-d.max_documents :]
    else:
        state.documents = list(hits)
    for h in hits:
        state.read.setdefault(h.id, h)
    state.events.append(
        RetrievalEvent(
            state.kept_tokens + (fire.keep if fire else 0),
            state.generated,
            query,
            form,
            fire.score if fire else 0.0,
            fire.reason if fire else "retrieve with the question before generating",
            tuple(h.id for h in hits),
        )
    )


def _complete(state: _State, lm: Backend, question: str, dataset: str | None, exemplars: str) -> str:
    """DRAGIN's last step: without "the answer is" in the output, append " So the answer is" and decode on."""
    if "answer is" in state.text.lower():
        return state.text.strip()
    text = state.text.rstrip() + COMPLETION
    request = GenerationRequest(
        messages(question, state.documents, dataset, exemplars),
        max_tokens=COMPLETION_TOKENS,
        assistant_prefix=text,
        stop=("\n",),
        top_logprobs=0,
    )
    gen = lm.generate([request])[0]
    state.stages.append(Stage.of("answer-is", gen))
    return (text + gen.text).strip()


def _decision(d: DynamicSpec, first: Fire | None, state: _State) -> GateDecision:
    threshold = first.threshold if first else (d.threshold or default_threshold(d.trigger) or 0.0)
    n = len(state.events)
    if first is not None:
        return GateDecision(True, first.score, threshold, f"{n} retrieval(s); first: {first.reason}")
    if n:
        return GateDecision(True, 0.0, threshold, "retrieved with the question before generating")
    return GateDecision(False, 0.0, threshold, f"{d.trigger}: the trigger never fired")
