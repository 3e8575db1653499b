"""``ragate.Pipeline``: one method, one model and one index (or your own search), answering questions.

    with ragate.Pipeline(method="targ-margin", index="my-index/") as rag:
        ans = rag.answer("When does the support contract renew?")
        ans.text, ans.retrieved, ans.decision.score, ans.decision.threshold, ans.documents, ans.stages

``ragate ask --method``, ``ragate calibrate --questions`` and ``ragate serve`` are built on this class. It checks
what the method needs (a backend with logprobs, an index with embeddings, ...) before it loads the model, loads
the model and the index once, and frees them on ``close()`` (or at the end of a ``with`` block). It is safe to
share between threads: a local model answers one question at a time.

A local llama.cpp model computes each call as ``ragate eval`` does (:class:`ragate.eval.calls.CallCache`, with no
store): from a cleared cache, its prompt started from the kept state of the earlier prompt sharing the longest
aligned prefix (the gate's draft prompt for the reading prompt after it; the instruction and exemplars of a dynamic
method), which gives the same logits bit for bit (:mod:`ragate.backends.prompt_states`). So an answer does not
depend on the questions before it and equals ``ragate eval``'s (a dynamic method's log-probabilities but for the
last digits: eval continues the engine's cache between a question's calls). The kept states are bounded in bytes:
``backend_options={"prompt_state_bytes": N}`` (0 keeps none; ``ragate serve --prompt-state-mb``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, cast

from tqdm.auto import tqdm

from ragate.answers.answer import (
    MAX_QUESTION_CHARS,
    Answer,
    Calibration,
    Document,  # noqa: F401 (ragate.Document is ragate.pipeline's too)
    Retrieval,
    check_question,
)
from ragate.answers.savings import AlwaysRetrieveCost, Cost, Savings
from ragate.arguments import check_arguments, check_types
from ragate.backends import Backend, load_backend
from ragate.backends.threads import thread_options
from ragate.backends.turns import DEFAULT_SHARE, stop_when_given_up
from ragate.errors import RagateError
from ragate.gates.base import GateDecision
from ragate.learning.learner import Learner, check_gate_file, left_open
from ragate.methods import MethodSpec, get_method, run_method
from ragate.methods.configure import configure_method
from ragate.methods.needs import require, require_index
from ragate.methods.paper_tau import TauHints
from ragate.methods.runner import decide
from ragate.methods.trace import Stage, Trace
from ragate.retrieval.types import Retriever
from ragate.tracing import Tracing

if TYPE_CHECKING:
    from ragate.learning.fit import Learned
    from ragate.learning.store import FeedbackResult
    from ragate.state.budget import BudgetController
    from ragate.state.route_budget import RouteBudgetController
    from ragate.types import Role

DEMO_INDEX = "the demo index (built on first use)"


class Pipeline:
    """Answer questions with one adaptive-retrieval method (see the module docstring).

    ``method``: a method name (``ragate.all_methods()``; a registered gate's name works too). ``model`` /
    ``backend`` / ``base_url``: the LM (default SmolLM2-135M on llama.cpp; ``base_url`` of an OpenAI-compatible
    server, or a list of several serving one model, implies ``backend="openai"``). ``index``: an index directory; or ``search``: your own search, a function
    ``(query, k) -> list of str | dict(text, title?, id?, score?, source?)`` or an object with ``search(query, k)``
    (ragate embeds what DTR/PAIRS selection needs with ``encoder``); neither: the demo index. ``threshold`` or
    ``calibration`` (a ``ragate calibrate`` file) set the gate's tau; ``budget`` holds the share of calls that
    retrieve at that rate over the last ``window`` answers instead (the live controller of ``ragate serve
    --budget``; a learned route policy: mean retrievals per question, :mod:`ragate.state.route_budget`); ``state`` (``redis://HOST:PORT/DB``, Valkey or Redis) keeps that window in a store that several
    replicas share, so that they hold one rate between them (:mod:`ragate.state.shared`). ``max_tokens`` bounds every answer stage, ``k`` the documents read; ``gate`` / ``selector``
    replace the method's own; ``prompts`` names another prompt set for it (``ragate.methods.prompts.PROMPT_SETS``);
    ``routes``: with ``method="route"``, the methods it routes between, cheapest first (:mod:`ragate.methods.route`);
    ``fallback`` names a gate to run where the backend cannot serve the method's.
    ``corpus``: with ``search``, the texts of the documents it searches, handed over once: the gates that count
    terms in the corpus (``corpus-coverage``, ``corpus-or-margin``, ``question-rarity``) then run over your search
    with no ragate index. ``lm`` / ``retriever``: ready-made ones, which stay the caller's to close. ``model_of``: another pipeline whose
    loaded model this one uses (one model in memory, one call at a time over both; it stays that pipeline's). Every answer is an OpenTelemetry
    span with the gate, retrieval and generations as children (:mod:`ragate.tracing`), sent to ``tracer_provider``
    or the application's global one; ``trace_content=True`` puts the question, answer and documents in them.
    ``threads`` / ``batch_threads``: a local engine's threads for decoding / prompt evaluation (llama.cpp; torch's
    for transformers); None or "auto" (the default) uses the CPUs of this process that other processes leave free,
    looked at again as it runs (:mod:`ragate.backends.threads`). ``early_exit`` (default True): a gate whose
    decision is settled before its draft ends (TARG's entropy and margin) stops the draft there, with the same
    decisions and answers (:mod:`ragate.gates.targ`); calls whose threshold the budget controller sets and
    :meth:`decide` / :meth:`scores` / :meth:`calibrate` always read whole drafts, since they rank the scores.

    Learning the traffic: ``feedback_store`` (a SQLite file, :mod:`ragate.learning.store`) keeps each answer with the
    features a learned gate reads (the question's signals, the draft's TARG scores, the model's hidden state at the
    direct prompt's last token) under ``Answer.id``; ``shadow`` (a share of answers, e.g. 0.05) runs the path the
    gate did not take after the answer returns, which labels the question (:mod:`ragate.learning.shadow`; a store under
    RAGATE_HOME when none is named), taking ``shadow_share`` of a local model's time while requests wait (all of it
    when none do; a request waits for it one model step at most: :mod:`ragate.backends.turns`); :meth:`feedback`
    adds a user's word on an answer; :meth:`learn` fits the learned gate on the store's labels and puts it in force.
    """

    def __init__(
        self,
        method: str = "dtr",
        *,
        model: str | None = None,
        backend: str | None = None,
        base_url: str | Sequence[str] | None = None,
        index: str | Path | None = None,
        search: Any = None,
        corpus: Iterable[str] | None = None,
        encoder: Any = None,
        threshold: float | None = None,
        calibration: str | Path | None = None,
        budget: float | None = None,
        window: int = 200,
        budget_gain: float | None = None,
        budget_state: str | Path | None = None,
        state: str | None = None,
        max_tokens: int | None = None,
        k: int | None = None,
        gate: str | None = None,
        selector: str | None = None,
        fallback: str | None = None,
        skr_labels: str | Path | None = None,
        gate_weights: str | Path | None = None,
        proxy_model: str | None = None,
        cross_encoder: str | Path | None = None,
        prompts: str | None = None,
        routes: Sequence[str] | None = None,
        seed: int = 0,
        lm: Backend | None = None,
        retriever: Retriever | None = None,
        backend_options: dict[str, Any] | None = None,
        threads: int | str | None = None,
        batch_threads: int | str | None = None,
        early_exit: bool = True,
        max_question_chars: int = MAX_QUESTION_CHARS,
        tracer_provider: Any = None,
        trace_content: bool | None = None,
        feedback_store: str | Path | Any = None,
        shadow: float = 0.0,
        shadow_queue: int = 64,
        shadow_share: float = DEFAULT_SHARE,
        model_of: Pipeline | None = None,
    ) -> None:
        check_types(method=method, index=index, calibration=calibration, budget_state=budget_state,
                    base_url=base_url, feedback_store=feedback_store)  # fmt: skip
        check_arguments(
            method=method, model=model, backend=backend, threshold=threshold, budget=budget, window=window,
            budget_gain=budget_gain, max_tokens=max_tokens, k=k, seed=seed, max_question_chars=max_question_chars,
            gate=gate, selector=selector, fallback=fallback, prompts=prompts,
        )  # fmt: skip
        self._closed, self.early_exit = False, bool(early_exit)
        if model_of is not None:  # share another pipeline's loaded model, one call at a time over both
            if not isinstance(model_of, Pipeline):
                raise RagateError(f"model_of= takes a ragate.Pipeline, not {type(model_of).__name__}")
            if given := [n for n, v in (("model", model), ("base_url", base_url), ("lm", lm)) if v is not None]:
                raise RagateError(f"model_of= shares that pipeline's model: drop {', '.join(given)}=")
            model_of._check_open()
            shared: Pipeline = model_of
            lm, backend = shared.lm, shared.lm.engine
        engine = backend or ("openai" if base_url else "llama.cpp")
        if base_url and engine != "openai":
            raise RagateError(f"base_url goes with backend='openai', not {engine!r}")
        if sum(x is not None for x in (index, search, retriever)) > 1:
            raise RagateError("give one of index=, search= or retriever=")
        if corpus is not None and search is None:
            raise RagateError("corpus= (your documents' texts) goes with search=: an index counts its own passages")
        if threshold is not None and calibration is not None:
            raise RagateError("give threshold= or calibration=, not both: a calibration file sets the threshold")
        self.method, self.model_name, self.engine, self.seed = method, model, engine, seed
        self.max_question_chars = max_question_chars
        self.tracing = Tracing(tracer_provider, trace_content)
        spec = configure_method(
            get_method(method), gate, selector, skr_labels, max_tokens, k, cross_encoder=cross_encoder,
            prompts=prompts, gate_weights=gate_weights, proxy_model=proxy_model, routes=routes,
        )  # fmt: skip
        self._max_tokens, self._k = max_tokens, k
        self.calibration: dict[str, Any] | None = None
        if calibration is not None:
            from ragate.eval.thresholds import check_calibration, read_calibration
            from ragate.methods.configure import calibrated

            self.calibration = read_calibration(calibration)
            check_calibration(self.calibration, calibration, method, model, engine)
            spec, threshold = calibrated(spec, self.calibration, calibration, routes_given=routes is not None)
        spec = spec.with_threshold(threshold)
        if gate_weights is not None and spec.gate.kind == "no-model-lr":
            from ragate.gates.weights import load_weights

            load_weights(gate_weights)  # a damaged file (a NaN coefficient) is refused before the model loads
        if budget is not None or state is not None:  # before the model loads: a state it could not keep
            from ragate.state.route_budget import check_live_budget

            check_live_budget(budget, window, budget_gain, budget_state, state, spec.with_threshold(threshold))
        self._owned: list[Any] = []
        self._lock: threading.RLock = threading.RLock() if model_of is None else model_of._lock
        self.learner = Learner(self, self._lock)  # turns at the model, feedback, shadow work, the learned gate
        self._savings = AlwaysRetrieveCost()
        self._tau_hints = TauHints()  # a paper's tau on another model: one line, once per gate
        self._encoder = encoder
        try:
            self.index_name, self._retriever = self._open_retriever(index, search, retriever, corpus)
            if self._retriever is not None:
                require_index(spec, self._retriever, where=self.index_name)
            if lm is None:
                options = dict(backend_options or {})
                if engine == "openai":
                    options.setdefault("base_url", base_url)
                options |= thread_options(engine, threads, batch_threads)
                lm = load_backend(model, engine, **options)
                self._owned.append(lm)
            raw = lm
            lm = self._with_proxy(lm, spec, threads)
            from ragate.eval.calls import exact_calls

            self.lm: Backend = exact_calls(lm)
            self.spec: MethodSpec = require(spec, lm.capabilities, engine=lm.engine, fallback=fallback)
            check_gate_file(self.spec, self.lm)
            self.budget: BudgetController | RouteBudgetController | None = None
            if budget is not None:
                from ragate.state.route_budget import open_live_budget

                self.budget = open_live_budget(budget, window, self.spec, budget_state, str(lm.model), budget_gain, state)
                self._owned.append(self.budget)
            self._local = lm.engine != "openai"  # a local model runs one call at a time
            self.learner.open(
                raw, share=shadow_share, turns_of=model_of.learner if model_of is not None else None,
                store=feedback_store, shadow=shadow, queue_size=shadow_queue,
            )  # fmt: skip
        except BaseException:
            self.close()
            raise

    # -- set-up -------------------------------------------------------------------------------------------------

    def _with_proxy(self, lm: Backend, spec: MethodSpec, threads: int | str | None) -> Backend:
        """``lm`` with the small proxy model opened beside it when the gate drafts with one (ragate.gates.proxy)."""
        from ragate.methods.proxy import attach_proxy

        owned = bool(self._owned) and self._owned[-1] is lm
        wrapped = attach_proxy(lm, [spec.gate], threads=threads, close_main=owned)
        if wrapped is not lm:
            if owned:
                self._owned[-1] = wrapped
            else:
                self._owned.append(wrapped)
        return wrapped  # type: ignore[no-any-return]

    def _open_retriever(
        self, index: Any, search: Any, retriever: Retriever | None, corpus: Iterable[str] | None = None
    ) -> tuple[str, Retriever | None]:
        """The index's name and the retriever; None for the demo index, which opens on first use."""
        from ragate.retrieval.serial import SerialRetriever

        if retriever is not None:
            return f"a given {retriever.kind} retriever", SerialRetriever(retriever)
        if search is not None:
            from ragate.retrieval.function import FunctionRetriever

            function = FunctionRetriever(search, encoder=self._encoder, corpus=corpus)
            self._owned.append(function)
            return f"search function {function.name!r}", SerialRetriever(function)
        if index is None:
            return DEMO_INDEX, None
        return str(index), self._open_index(index)

    def _open_index(self, path: str | Path) -> Retriever:
        """An index directory opened (verified) for this pipeline, which closes it."""
        from ragate.retrieval.index import open_index
        from ragate.retrieval.serial import SerialRetriever

        opened = open_index(path, encoder=self._encoder)
        self._owned.append(opened)
        return SerialRetriever(opened)

    @property
    def retriever(self) -> Retriever:
        """The index (or search) this pipeline reads; the demo index is built and opened on first use."""
        with self._lock:
            if self._retriever is None:
                from ragate.retrieval.demo import demo_index

                path = demo_index()
                self._retriever, self.index_name = self._open_index(path), f"the demo index ({path})"
            return self._retriever

    # -- answering ----------------------------------------------------------------------------------------------
    def spec_for(
        self,
        method: str | None = None,
        *,
        threshold: float | None = None,
        k: int | None = None,
        max_tokens: int | None = None,
    ) -> MethodSpec:
        """The method a call runs: this pipeline's (``method`` None or its name) or another, with the call's
        threshold, number of documents and answer length; checked against the backend and the index."""
        self._check_open()
        check_arguments(method=method, threshold=threshold, k=k, max_tokens=max_tokens)
        if method is None or method == self.method:
            spec = self.spec
            if threshold is None and self.budget is not None:
                threshold = self.budget.tau
        else:  # another method: served as it is or refused (the fallback stands in for this pipeline's only)
            spec = require(get_method(method), self.lm.capabilities, engine=self.lm.engine)
            max_tokens = self._max_tokens if max_tokens is None else max_tokens  # the pipeline's limits hold
            k = self._k if k is None else k
        spec = configure_method(spec, None, None, None, max_tokens, k).with_threshold(threshold)
        if self._retriever is not None:  # the demo index serves every method
            require_index(spec, self._retriever, where=self.index_name)
        self._tau_hints.note(spec, self.model_label, method or self.method)
        return spec

    def controls(self, method: str | None, threshold: float | None) -> bool:
        """Whether the budget controller sets this call's threshold: this pipeline's method, no threshold given."""
        return self.budget is not None and method in (None, self.method) and threshold is None

    @contextlib.contextmanager
    def model_lock(self) -> Iterator[None]:
        """Held while a local model answers (one question at a time), counted as a request in flight from before
        it waits (shadow work then takes only its share: :mod:`ragate.backends.turns`); a no-op for a server."""
        turns = self.learner.turns
        if turns is None:
            yield
            return
        with turns.in_flight(), self._lock:
            yield

    def answer(
        self,
        question: str,
        *,
        method: str | None = None,
        threshold: float | None = None,
        k: int | None = None,
        max_tokens: int | None = None,
        progress: Callable[[str], None] | None = None,
        still_wanted: Callable[[], bool] | None = None,
    ) -> Answer:
        """Answer ``question``: the gate decides, documents are read if it says so, the model answers.

        ``method``, ``threshold``, ``k`` and ``max_tokens`` change this call only. ``progress`` is called with
        each stage's name as it starts. ``still_wanted`` is asked once the model is free and before each stage
        (each model step on a local model); False stops the work there (a caller that timed out)."""
        question = check_question(question, self.max_question_chars)
        spec = self.spec_for(method, threshold=threshold, k=k, max_tokens=max_tokens)
        model, engine = self.model_label, self.lm.engine
        with self.tracing.span("ragate.answer", spec.name, model=model, engine=engine) as span:
            with self.learner.answering(), self.model_lock(), self.learner.wanted(still_wanted):
                if still_wanted is not None and not still_wanted():
                    raise TimeoutError("given up while waiting for the model")
                retriever = self.retriever if spec.retrieves else self._retriever
                early = self.early_exit and not self.controls(method, threshold)  # the controller ranks scores
                trace = run_method(
                    spec, question, self.lm, retriever, seed=self.seed, early_exit=early,
                    progress=stop_when_given_up(progress, still_wanted), hidden=self.learner.store is not None and spec.dynamic is None,
                )  # fmt: skip
            self.tracing.finish(span, trace, model=model, engine=engine)
        if self.controls(method, threshold) and self.budget is not None:
            self.budget.observe_trace(trace, spec)
        answer = Answer.of(trace)
        if self.learner.store is not None and spec.dynamic is None:
            answer = self.learner.keep(answer, spec, method)
        return answer

    def retrieve(
        self,
        question: str,
        *,
        method: str | None = None,
        threshold: float | None = None,
        k: int | None = None,
        answer_skipped: bool = False,
        select: bool = True,
    ) -> Retrieval:
        """The gate's decision for ``question`` and, when it says "retrieve", the documents the method chooses
        (its selector over this pipeline's index or search: DPR-AIS for DTR and PAIRS, the question's top k for
        TARG), with no answer written. A budget controller counts it like an answer. Dynamic methods and
        CRAG-lite decide while answering: use :meth:`answer`.

        ``answer_skipped=True``: where the gate says "no", also the model's own answer (``Retrieval.answer``: the
        gate's draft continued, as :meth:`answer` writes it), so a framework reading with this pipeline's model
        (:meth:`complete`) never pays the draft twice. ``select=False``: the gate alone, no documents where it
        says "retrieve" (a router whose retrieving branch searches by itself)."""
        from ragate.methods.runner import select_documents

        question = check_question(question, self.max_question_chars)
        spec = self.spec_for(method, threshold=threshold, k=k)
        model, engine = self.model_label, self.lm.engine
        try:
            with self.tracing.span("ragate.retrieve", spec.name, model=model, engine=engine) as span:
                with self.model_lock():
                    early = self.early_exit and not self.controls(method, threshold)
                    trace = select_documents(
                        spec, question, self.lm, self.retriever, seed=self.seed, early_exit=early,
                        answer_skipped=answer_skipped, select=select,
                    )  # fmt: skip
                self.tracing.finish(span, trace, model=model, engine=engine)
        except ValueError as err:
            if isinstance(err, RagateError):
                raise
            raise RagateError(str(err)) from None
        if self.controls(method, threshold) and self.budget is not None:
            self.budget.observe_trace(trace, spec)
        return Retrieval.of(trace)

    def complete(
        self, prompt: str | Sequence[tuple[str, str]], *, max_tokens: int | None = None
    ) -> tuple[str, Stage]:
        """This pipeline's model as a plain LLM: the greedy reply to ``prompt`` (a user message, or (role, text)
        pairs rendered with the model's chat template), and its stage (tokens, seconds). What a framework's LLM
        type calls (``ragate.integrations``), so the framework reads with the model the gate drafts with, loaded
        once. ``max_tokens``: default the method's answer length."""
        from ragate.types import GenerationRequest, Message

        self._check_open()
        if isinstance(prompt, str):
            messages: tuple[Message, ...] = (Message("user", prompt),)
        else:
            if bad := [role for role, _ in prompt if role not in ("system", "user", "assistant")]:
                raise RagateError(f"complete(): role {bad[0]!r} is not one of system, user, assistant")
            messages = tuple(Message(cast("Role", role), text) for role, text in prompt)
        if not messages or not any(m.content.strip() for m in messages):
            raise RagateError("complete() got an empty prompt: give the text the model should answer")
        request = GenerationRequest(messages, max_tokens=max_tokens or self.spec.max_tokens)
        span = self.tracing.span("ragate.complete", self.spec.name, model=self.model_label, engine=self.lm.engine)
        with span, self.model_lock():
            gen = self.lm.generate([request])[0]
        return gen.text, Stage.of("read", gen)

    def savings(self, trace: Trace, *, read: Cost | None = None) -> Savings:
        """What ``trace``'s gate saved against always retrieving, as ``ragate serve`` reports it per request
        (:class:`ragate.answers.savings.AlwaysRetrieveCost`, one running estimate per pipeline). ``read``: what another
        LLM's read of the chosen documents cost (a framework's, from its usage), for a trace that stops at them."""
        return self._savings.savings(trace, read=read)

    def decide(self, question: str, *, seed: int | None = None) -> GateDecision:
        """Only the gate's decision and score for ``question`` (no answer is written). Under a budget it is decided
        at the controller's tau and counted, like an answer (a router in front of another reader)."""
        if self.budget is None:
            self._tau_hints.note(self.spec, self.model_label, self.method)
            return self._decide(question, seed)
        decision = self._decide(question, seed, threshold=self.budget.tau)
        self.budget.observe(decision.score, decision.retrieve)
        return decision

    def _decide(self, question: str, seed: int | None, *, threshold: float | None = None) -> GateDecision:
        self._check_open()
        question = check_question(question, self.max_question_chars)
        from ragate.gates.registry import get_gate

        spec = self.spec if threshold is None else self.spec.with_threshold(threshold)
        gate = get_gate(spec.gate.kind)
        needs_index = gate.needs_embeddings or gate.reads_index
        with self.model_lock():
            retriever = self.retriever if needs_index else self._retriever
            return decide(spec, question, self.lm, retriever, seed=self.seed if seed is None else seed)

    def scores(
        self, questions: Iterable[str], *, progress: bool = False, concurrency: int = 1
    ) -> list[GateDecision]:
        """The gate's decisions for many questions (question i with seed ``seed + i``, as ``ragate eval``), in
        their order; ``concurrency`` of them at once over a server backend (a local model takes one at a time)."""
        items = list(questions)
        if concurrency < 1:
            raise RagateError(f"concurrency must be >= 1, not {concurrency}")
        with tqdm(total=len(items), desc=f"score {self.spec.name}", unit="q", disable=not progress) as bar:

            def one(item: tuple[int, str]) -> GateDecision:
                decision = self._decide(item[1], self.seed + item[0])  # scores only: no budget counts them
                bar.update(1)
                return decision

            if concurrency == 1 or self._local:
                return [one(item) for item in enumerate(items)]
            with ThreadPoolExecutor(max_workers=concurrency) as pool:
                return list(pool.map(one, enumerate(items)))

    def calibrate(
        self,
        questions: Iterable[str] | str | Path,
        budget: float,
        *,
        confidence: float | None = None,
        batch: int | None = None,
        progress: bool = False,
        source: str | None = None,
        concurrency: int = 1,
    ) -> Calibration:
        """Set this pipeline's threshold so that a share ``budget`` of questions like ``questions`` retrieves.

        ``questions``: a list of questions, or a file (one question a line, or JSONL with "question"; answers are
        not needed). Without ``confidence``, tau = F^-1(1 - budget) over their scores (TARG section 3.3); with it,
        the order statistic that keeps the rate on *new* questions at most ``budget`` with that probability
        (``batch``: over every ``batch`` new questions). It holds only while new questions are like these: for
        live traffic, ``budget=`` (the controller) holds the rate as the mix drifts. ``concurrency``: questions
        scored at once over a server backend."""
        from ragate.eval.thresholds import check_budget_value, check_calibratable

        self._check_open()
        check_budget_value(budget, "budget")  # before any question is scored
        check_calibratable(self.spec)
        if isinstance(questions, str | Path):
            from ragate.eval.datasets import read_questions

            source = source or str(questions)
            questions = read_questions(questions)
        scores = [d.score for d in self.scores(questions, progress=progress, concurrency=concurrency)]
        calibration = Calibration.from_scores(
            scores, budget, confidence=confidence, batch=batch,
            method=self.method,  # the name asked for (a fallback gate renames the spec)
            gate=self.spec.gate.kind, model=self.model_name, engine=self.engine, source=source or "questions",
        )  # fmt: skip
        self.spec = self.spec.with_threshold(calibration.tau)
        if calibration.warning:
            import warnings

            warnings.warn(calibration.warning, RuntimeWarning, stacklevel=2)
        return calibration

    @property
    def model_label(self) -> str:
        """The model's name as traces and logs give it: a file's name, not its path."""
        return Path(str(self.lm.model)).name or str(self.lm.model)

    @property
    def prompt_states(self) -> dict[str, int] | None:
        """The prompt states the model keeps for exact reuse (``kept``, ``bytes``, ``max_bytes``); None where the
        backend keeps none (an API, transformers)."""
        states = getattr(self.lm, "prompt_states", None)
        return dict(states) if isinstance(states, dict) else None

    # -- learning (ragate.learning.learner) ------------------------------------------------------------------------
    def feedback(
        self, answer: Answer | str, *, correct: bool | None = None, reference: str | None = None
    ) -> FeedbackResult:
        """A user's word on an answer (an :class:`ragate.Answer` this pipeline gave, or its ``id``): ``correct`` and/or
        the ``reference``; each labels the path whose answer it judged, and a reference on an answer whose other path is
        unknown queues that path's answer (its label pending until then). Returns its labels made and pending."""
        return self.learner.feedback(answer, correct=correct, reference=reference)

    def learn(
        self, out: str | Path | None = None, *, label: str | None = None, cascade: float | None = None,
        hidden: bool = True, use: bool = True,
    ) -> Learned:  # fmt: skip
        """Fit the learned gate on the store's labels of ``label`` (``closed-wrong``: gold; ``retrieval-changed``:
        silver; None: gold first) for this pipeline's prompts, compared with the gate in force on them, and write it
        to ``out`` (default: beside the store). With ``use`` it goes in force (at the threshold keeping this traffic's
        retrieval rate) only if it ranks them at least as well or no comparison can be made yet, else it stays a
        candidate beside ``out``. ``cascade``: the share of questions whose TARG draft it may pay. Returns
        :class:`Learned`; refuses, naming how many more labels it needs, while a class has fewer than 10."""
        return self.learner.learn(out, label=label, cascade=cascade, hidden=hidden, use=use)

    def learn_routes(self, budget: float | None = None, out: str | Path | None = None, *, use: bool = False) -> dict[str, Any]:
        """A route pipeline's learned policy for ``budget`` retrievals per question (None: the live budget's, else the
        calibration file's) from its store's labelled route answers (:mod:`ragate.learning.route_traffic`), saved at
        ``out`` (default: beside the store); ``use``: put in force if it picks as well as the policy in force on them."""
        return self.learner.learn_routes(budget, out, use=use)

    # -- lifetime -----------------------------------------------------------------------------------------------
    def close(self, *, wait: float | None = None) -> None:
        """Free what this pipeline opened (ready-made models and indexes stay open). Shadow work stops first, without
        waiting for the model: its queued jobs are dropped and a running one stops at its next model step. A question
        being answered then finishes before the rest is freed; ``wait`` bounds how many seconds to wait for it. Past
        them the feedback store is closed all the same, but the model and the index the question may still be using
        are left open for the process's exit to free (freeing them under a running model step could crash it)."""
        learner = getattr(self, "learner", None)  # None: __init__ failed before it
        if learner is not None:
            learner.stop_shadow()
        held = self._lock.acquire(timeout=-1 if wait is None else wait)
        try:
            self._closed = True
            if learner is not None:
                learner.close(everything=held)  # the feedback store is closed all the same
            while self._owned:
                opened = self._owned.pop()
                if held:
                    opened.close()
        finally:
            if held:
                self._lock.release()
        if not held:
            left_open(wait)

    def _check_open(self) -> None:
        if self._closed:
            raise RagateError(
                "this Pipeline is closed (its model and index were freed): make a new one, or use it inside its "
                "`with` block"
            )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
