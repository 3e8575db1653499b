"""What :class:`ragate.Pipeline` does to learn the traffic it serves (a mixin, so that ``pipeline.py`` stays the
answering face): the feedback store each answer and its features go to, the shadow worker that runs the path the
gate did not take, a user's feedback, and the learned gate fitted and put in force (:mod:`ragate.feedback`,
:mod:`ragate.shadow`, :mod:`ragate.learning`, :mod:`ragate.gates.learned`)."""

from __future__ import annotations

import contextlib
import numbers
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragate.errors import RagateError
from ragate.methods import MethodSpec, run_method


class TrafficLearning:
    """The learning half of :class:`ragate.Pipeline`; it reads the pipeline's model, lock, method and owned
    resources."""

    store: Any
    shadow: Any
    gate_file: str | None
    spec: MethodSpec
    seed: int
    lm: Any
    _owned: list[Any]
    _lock: Any
    _answering: int
    _count_lock: threading.Lock
    _side_errors: set[str]

    if TYPE_CHECKING:  # the pipeline's own, which these methods use

        def spec_for(self, method: str | None = None) -> MethodSpec: ...

        def model_lock(self) -> contextlib.AbstractContextManager[Any]: ...

        @property
        def retriever(self) -> Any: ...

        @property
        def model_label(self) -> str: ...

    def _open_learning(self, store: Any, shadow: float, queue_size: int) -> None:
        """The feedback store and the shadow worker, where asked for."""
        from ragate.feedback import FeedbackRules
        from ragate.shared_feedback import open_feedback_store

        if isinstance(shadow, bool) or not isinstance(shadow, numbers.Real) or not 0.0 <= shadow <= 1.0:
            raise RagateError(
                f"shadow is the share of answers shadowed, a number in [0, 1], not {shadow!r:.40}"
            )
        if store is None and shadow > 0:
            from ragate.models import ragate_home

            store = ragate_home() / "feedback.db"
        if store is not None:
            self.store = store if isinstance(store, FeedbackRules) else open_feedback_store(store)
            if not isinstance(store, FeedbackRules):
                self._owned.append(self.store)
        if shadow > 0:
            from ragate.shadow import Shadow

            self.shadow = Shadow(
                float(shadow), self._shadow_answer, self._shadow_label, busy=lambda: self._answering > 0,
                queue_size=queue_size, seed=self.seed,
            )  # fmt: skip
            self._owned.append(self.shadow)
        if self.spec.gate.kind == "learned":
            self.gate_file = self.spec.gate.weights

    @contextlib.contextmanager
    def _count_answering(self) -> Iterator[None]:
        with self._count_lock:
            self._answering += 1
        try:
            yield
        finally:
            with self._count_lock:
                self._answering -= 1

    def _keep(self, answer: Any, spec: MethodSpec, method: str | None) -> Any:
        """Record ``answer`` and its features in the store under a new id, and offer it to the shadow worker; a
        store that fails costs a warning (once per kind of failure), never the answer."""
        import dataclasses
        import uuid

        from ragate.learning import answer_features
        from ragate.shadow import ShadowJob

        assert self.store is not None
        answer_id = uuid.uuid4().hex
        try:
            features = answer_features(answer.question, answer.trace.draft)
            self.store.record_answer(
                answer_id, question=answer.question, method=spec.name, prompts=spec.prompts.name,
                answer=answer.text, retrieved=answer.retrieved, features=features, hidden=answer.trace.hidden,
                model={"model": self.model_label, "engine": self.lm.engine},
            )  # fmt: skip
        except Exception as err:  # noqa: BLE001 (a side channel: any failure costs a warning, not the answer)
            self._side_warning("feedback store", err)
            return answer
        answer = dataclasses.replace(answer, id=answer_id)
        if self.shadow is not None:
            self.shadow.offer(ShadowJob(answer_id, answer.question, answer.retrieved, answer.text, method))
        return answer

    def _side_warning(self, what: str, err: Exception) -> None:
        import warnings

        key = f"{what}:{type(err).__name__}"
        if key not in self._side_errors:
            self._side_errors.add(key)
            warnings.warn(
                f"ragate: the {what} failed ({type(err).__name__}: {err}); answers go on without it",
                RuntimeWarning,
                stacklevel=3,
            )

    def _shadow_answer(self, job: Any) -> str:
        """The path the gate did not take for ``job`` (see :mod:`ragate.shadow`)."""
        from dataclasses import replace as _replace

        from ragate.gates.spec import GateSpec
        from ragate.shadow import Preempted

        def yield_to_requests(stage: str) -> None:  # at each stage: a request waiting takes the model first
            if self._answering > 0:
                raise Preempted(stage)

        spec = self.spec_for(job.method)
        other = _replace(spec, gate=GateSpec("never" if job.retrieved else "always"))
        with self.model_lock():
            retriever = None if job.retrieved else self.retriever
            trace = run_method(
                other, job.question, self.lm, retriever, seed=self.seed, progress=yield_to_requests
            )
        return trace.answer

    def _shadow_label(self, job: Any, other: str) -> dict[str, bool]:
        from ragate.feedback import answer_correct, answers_agree

        assert self.store is not None
        closed, opened = (other, job.answer) if job.retrieved else (job.answer, other)
        self.store.set_twin(job.answer_id, closed=closed, opened=opened)
        labels = {"retrieval-changed": not answers_agree(closed, opened)}
        if job.reference is not None:
            labels["closed-wrong"] = not answer_correct(closed, job.reference)
        for kind, value in labels.items():
            self.store.add_label(
                job.answer_id, source="shadow", kind=kind, value=value, detail={"other": other[:500]}
            )  # type: ignore[arg-type]
        return labels

    def feedback(
        self, answer: Any, *, correct: bool | None = None, reference: str | None = None
    ) -> list[tuple[str, bool]]:
        """A user's word on an answer (an :class:`ragate.Answer` this pipeline gave, or its ``id``): ``correct`` and/or the
        ``reference`` answer. Returns the gate labels it gave (:meth:`ragate.feedback.FeedbackStore.feedback`)."""
        if self.store is None:
            raise RagateError(
                "this pipeline keeps no feedback: make it with feedback_store='feedback.db' (or shadow=)"
            )
        answer_id = answer if isinstance(answer, str) else getattr(answer, "id", None)
        if not isinstance(answer_id, str) or not answer_id:
            raise RagateError("feedback names an answer this pipeline gave (its Answer, or Answer.id)")
        return list(self.store.feedback(answer_id, correct=correct, reference=reference))

    def learn(
        self,
        out: str | Path | None = None,
        *,
        label: str = "closed-wrong",
        cascade: float | None = None,
        hidden: bool = True,
        use: bool = True,
    ) -> Any:
        """Fit the learned gate on the store's labels of ``label`` (``closed-wrong``: gold; ``retrieval-changed``:
        shadow's silver) for this pipeline's prompts, write it to ``out`` (default: beside the store), and with
        ``use`` put it in force as this pipeline's gate. ``cascade``: the share of questions whose TARG draft the
        cascade may pay (None: the cheap gate alone). Returns :class:`ragate.learning.Learned` (the file and the
        cross-fitted report). Refuses, naming how many more labels it needs, while a class has fewer than 10."""
        from dataclasses import replace as _replace

        from ragate.learning import learn_from_store

        if self.store is None:
            raise RagateError("this pipeline keeps no labels: make it with feedback_store= or shadow=")
        target = (
            Path(out) if out is not None else self.store.gate_path()
        )
        learned = learn_from_store(
            self.store, target, label=label, prompts=self.spec.prompts.name, cascade=cascade, hidden=hidden,
            model={"model": self.model_label, "engine": self.lm.engine},
        )  # fmt: skip
        if use:
            from ragate.gates.spec import GateSpec

            with self._lock:
                self.spec = _replace(self.spec, gate=GateSpec("learned", weights=str(learned.path)))
                self.gate_file = str(learned.path)
        return learned
