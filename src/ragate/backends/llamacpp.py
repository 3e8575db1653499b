"""llama.cpp backend (llama-cpp-python): GGUF models, the fast default on CPU.

The model's logits are read after each step and ragate's own loop (:mod:`ragate.backends.decoding`) picks tokens,
so every step carries the exact log-probability, top-k list and entropy without ``logits_all`` (which would keep
a context-by-vocabulary float matrix in memory). Prompts are tokenised exactly as ``Llama.create_completion``
does, and greedy output equals its ``temperature=0`` output. The key/value cache is kept between requests: a
prompt that extends the previous sequence (a draft continued, N samples of one prompt) only evaluates new tokens.
Inside :meth:`LlamaCppBackend.exact_prefix_reuse` a prompt evaluated from a cleared cache starts instead from the
kept state of an earlier prompt, cut at an aligned length, which gives the same logits bit for bit
(:mod:`ragate.backends.prompt_states`). Its thread counts follow :mod:`ragate.backends.threads`: by default as
many threads as this process has CPUs that other processes leave free, looked at again between tokens.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ragate.backends.base import Backend, Capabilities, check_text
from ragate.backends.decoding import Recompute, Watch, check_prompt_fits, common_prefix_len, decode
from ragate.backends.prompt_states import DEFAULT_STATE_BYTES, KeptPrompt, PrefixReuse, PromptStates
from ragate.backends.template import chat_segments
from ragate.backends.threads import ThreadPolicy, check_threads, usable_cpus
from ragate.errors import ModelNotFoundError, RagateError
from ragate.types import Generation, GenerationRequest, Message

MAX_TOP_K = 100
DEFAULT_CONTEXT = 4096


def _import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as err:
        raise RagateError(
            "the llama.cpp backend needs llama-cpp-python: run `pip install 'ragate[llamacpp]'` "
            "(it builds from source the first time, ~8 minutes on 2 cores)"
        ) from err
    return llama_cpp


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, so ``taskset -c 0`` gives one thread), at least 1."""
    return max(1, len(usable_cpus()))


class LlamaCppBackend(Backend):
    """A GGUF model run by llama.cpp, with per-token logprobs, top-k and exact entropy; no attentions."""

    engine = "llama.cpp"

    def __init__(
        self,
        model_path: str | Path,
        *,
        name: str | None = None,
        n_ctx: int = DEFAULT_CONTEXT,
        n_threads: int | str | None = None,
        n_threads_batch: int | str | None = None,
        prompt_state_bytes: int = DEFAULT_STATE_BYTES,
        step_tokens: int | None = None,
    ) -> None:
        """``prompt_state_bytes`` bounds the prompt states kept for :meth:`exact_prefix_reuse` (0: none).
        ``n_threads`` (decoding) and ``n_threads_batch`` (prompt evaluation, default: as ``n_threads``) are whole
        numbers, or None / "auto": the CPUs of this process that other processes leave free
        (:mod:`ragate.backends.threads`). ``step_tokens``: evaluate prompts at most this many tokens per model step
        (None: llama.cpp's batches), so that a step taken under :attr:`step` (:mod:`ragate.backends.turns`) is
        short: what the background context of a pipeline's shadow work uses."""
        try:
            threads = ThreadPolicy(
                check_threads(n_threads, "n_threads"), check_threads(n_threads_batch, "n_threads_batch")
            )
        except ValueError as err:
            raise RagateError(str(err)) from None
        llama_cpp = _import_llama_cpp()
        path = Path(model_path)
        if not path.is_file():
            raise ModelNotFoundError(f"no GGUF file at {path}: the llama.cpp backend loads a .gguf file")
        self._lib = llama_cpp
        self._threads = threads
        n, n_batch = threads.current()
        self._llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=n,
            n_threads_batch=n_batch,
            logits_all=False,
            verbose=False,
        )
        self.model = name or str(path)
        self.max_context = n_ctx
        self._path, self._thread_args = path, (n_threads, n_threads_batch)
        self._states = PromptStates(prompt_state_bytes)
        self.evaluated_tokens = 0  # tokens the engine has evaluated (prompt and generated), for cost measurements
        self._reuse: PrefixReuse | None = None
        self._n_vocab = self._llm.n_vocab()
        template = self._llm.metadata.get("tokenizer.chat_template")
        self._chat = None
        if template:
            internals = self._llm._model
            eos, bos = self._llm.token_eos(), self._llm.token_bos()
            self._chat = llama_cpp.llama_chat_format.Jinja2ChatFormatter(
                template=template,
                eos_token=internals.token_get_text(eos) if eos != -1 else "",
                bos_token=internals.token_get_text(bos) if bos != -1 else "",
            )
        self.capabilities = Capabilities(
            logprobs=True,
            top_k=MAX_TOP_K,
            attentions=False,
            sampling=True,
            chat_template=self._chat is not None,
            full_distribution=True,
            token_ids=True,
            prefix_cache=True,
            hidden_states=True,
        )
        self._hidden_from_state: np.ndarray | None = None
        self._hidden_wanted = False
        if step_tokens is not None and step_tokens < 1:
            raise RagateError(f"step_tokens must be at least 1, not {step_tokens}")
        self.step_tokens = step_tokens

    # -- LogitSource -------------------------------------------------------------------------------------------
    def is_end(self, token_id: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._llm._model.vocab, token_id))

    @property
    def thread_counts(self) -> dict[str, object]:
        """The engine's thread counts now and how they are chosen (``auto`` or ``fixed``)."""
        return self._threads.describe()

    def _adapt_threads(self) -> None:
        changed = self._threads.look()
        if changed is not None and self._llm is not None:
            self._lib.llama_set_n_threads(self._llm.ctx, *changed)

    def next_logits(self, token_ids: Sequence[int]) -> np.ndarray:
        self._adapt_threads()
        llm = self._llm
        if self._reuse is not None and llm.n_tokens == 0:
            return self._exact_prompt_logits(token_ids, self._reuse)
        keep = common_prefix_len(llm.input_ids[: llm.n_tokens].tolist(), token_ids)
        if keep == len(token_ids):
            keep -= 1  # re-evaluate the last token to get its logits
        llm.n_tokens = keep
        self._eval(list(token_ids[keep:]))
        self.evaluated_tokens += len(token_ids) - keep
        return self._last_logits()

    def hidden_state(self, prompt: str | tuple[Message, ...], assistant_prefix: str = "") -> np.ndarray:
        """The model's last-layer hidden state (after the final norm, before the output head) at the prompt's last
        token: what the model "thinks" before it writes the answer, a feature a learned gate reads
        (:mod:`ragate.gates.learned`). The prompt is evaluated as a generation of it would evaluate it (from the
        kept state of an earlier prompt inside :meth:`exact_prefix_reuse`), and its state is kept: a generation of
        the same prompt right after starts from it and evaluates nothing again. Its last token is evaluated alone,
        with llama.cpp's embeddings output on for that one step: with embeddings on, llama.cpp outputs every token
        of a batch, so the output head would run over the whole prompt, where one single-token step runs it once
        (the learned gate's cost: ``benchmarks/gate_overhead.py --gates never,always,learned``). That step takes
        llama.cpp's single-token kernels, so the last token's logits differ a little from a batch evaluation's
        (the greedy token is the same as a rule, not always); the generation after this call reads them. The
        method that asks for a hidden state asks before any other call of that prompt, so its outputs do not depend
        on the calls before it; inside one :meth:`exact_prefix_reuse` block a later method's call of the same
        prompt reuses this state."""
        ids = self.tokenize(prompt, assistant_prefix)
        check_prompt_fits(len(ids), self.max_context, "shorten the prompt or load with a larger n_ctx")
        self._hidden_from_state = None
        self._hidden_wanted = True
        try:
            self.next_logits(ids)
            if self._hidden_from_state is not None:
                return self._hidden_from_state.copy()
            return self._last_hidden()
        finally:
            self._hidden_wanted = False

    def _eval(self, tokens: list[int], final: bool = True) -> None:
        """``Llama.eval``. While a hidden state is asked for, the ``final`` piece of a prompt ends with its last token
        evaluated alone with the embeddings output on: llama.cpp outputs every token of a batch while embeddings
        are on, so only that one step pays for the output head."""
        llm = self._llm
        if not (self._hidden_wanted and final and tokens):
            self._steps(tokens)
            return
        if len(tokens) > 1:
            self._steps(tokens[:-1])
        self._lib.llama_set_embeddings(llm.ctx, True)
        try:
            self._steps(tokens[-1:])
        finally:
            self._lib.llama_set_embeddings(llm.ctx, False)

    def _steps(self, tokens: list[int]) -> None:
        """``Llama.eval`` of ``tokens``, each model step (at most :attr:`step_tokens` tokens) taken under
        :attr:`step` where a pipeline set one (turns at the model: :mod:`ragate.backends.turns`)."""
        step, size = self.step, self.step_tokens
        if step is None:
            self._llm.eval(tokens)
            return
        size = size or len(tokens) or 1
        for start in range(0, len(tokens), size):
            with step():
                self._llm.eval(tokens[start : start + size])

    def _last_hidden(self) -> np.ndarray:
        ptr = self._lib.llama_get_embeddings_ith(self._llm.ctx, -1)
        if not ptr:
            raise RagateError(f"llama.cpp gave no hidden state for {self.model!r}'s last prompt token")
        n = int(self._lib.llama_model_n_embd(self._llm.model))
        return np.ctypeslib.as_array(ptr, shape=(n,)).astype(np.float32, copy=True)

    def _last_logits(self) -> np.ndarray:
        ptr = self._lib.llama_get_logits_ith(self._llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).copy()

    # -- exact prefix reuse ------------------------------------------------------------------------------------
    @contextmanager
    def exact_prefix_reuse(self) -> Iterator[PrefixReuse]:
        """Inside the block, a prompt evaluated from a cleared cache (the first step after :meth:`clear_cache`)
        starts from the kept state of the earlier such prompt sharing the longest aligned prefix, and its own state
        is kept: the logits are those of evaluating it all, bit for bit, so a call's output does not depend on the
        calls before it. The block's :class:`PrefixReuse` counts the tokens not evaluated again and what they
        took when they were. A block inside another counts its own tokens, and the outer block's reuse goes on
        after it."""
        reuse, outer = PrefixReuse(), self._reuse
        self._reuse = reuse
        try:
            yield reuse
        finally:
            self._reuse = outer

    def drop_prompt_states(self) -> None:
        """Forget the prompt states kept for :meth:`exact_prefix_reuse` (their memory is freed)."""
        self._states.clear()

    @property
    def prompt_states(self) -> dict[str, int]:
        """The prompt states kept for :meth:`exact_prefix_reuse`: how many, their bytes, and the bound."""
        return {"kept": len(self._states), "bytes": self._states.nbytes, "max_bytes": self._states.max_bytes}

    def _exact_prompt_logits(self, token_ids: Sequence[int], reuse: PrefixReuse) -> np.ndarray:
        llm = self._llm
        wanted = self._hidden_wanted
        whole = self._states.whole(token_ids)
        if wanted and whole is not None and whole.hidden is None:
            whole = None  # kept without its hidden state: evaluate it again, with its last token apart
        if whole is not None and self._restore(whole, len(token_ids)):
            if wanted:
                self._hidden_from_state = whole.hidden  # evaluated before: nothing to compute
            reuse.tokens += len(token_ids)
            reuse.seconds += whole.seconds
            reuse.cpu_seconds += whole.cpu_seconds
            return np.array(whole.logits, copy=True)
        wall, cpu = time.perf_counter(), time.process_time()
        keep, kept = self._states.best(token_ids)
        if kept is None or not self._restore(kept, keep):
            keep, kept = 0, None
            llm.n_tokens = 0
        # batches end where evaluating the whole prompt would end them (multiples of n_batch), so the last, possibly
        # short, batch holds the same tokens either way (a batch under 8 tokens takes another kernel path)
        start, step = keep, llm.n_batch
        while start < len(token_ids):
            end = min(len(token_ids), (start // step + 1) * step)
            self._eval(list(token_ids[start:end]), final=end == len(token_ids))
            self.evaluated_tokens += end - start
            start = end
        logits = self._last_logits()
        hidden = self._last_hidden() if wanted else None
        self._hidden_from_state = hidden
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        share_wall, share_cpu = kept.share(keep) if kept is not None else (0.0, 0.0)
        reuse.tokens += keep
        reuse.seconds += share_wall
        reuse.cpu_seconds += share_cpu
        if self._states.keeps(len(token_ids)):
            state, nbytes = self._save()
            if nbytes:
                kept_logits = logits.copy()
                self._states.add(
                    KeptPrompt(
                        tuple(token_ids), state, nbytes, wall + share_wall,
                        cpu + share_cpu, kept_logits, hidden,
                    )
                )  # fmt: skip
        return logits

    def _save(self) -> tuple[object, int]:
        """llama.cpp's state of sequence 0 (its key/value cells) as a byte array, and its length."""
        lib, ctx = self._lib, self._llm.ctx
        size = int(lib.llama_state_seq_get_size(ctx, 0))
        buf = (ctypes.c_uint8 * size)()
        return buf, int(lib.llama_state_seq_get_data(ctx, buf, size, 0))

    def _restore(self, kept: KeptPrompt, keep: int) -> bool:
        """Load ``kept``'s state and keep its first ``keep`` tokens (the next eval drops the rest)."""
        llm = self._llm
        llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        if int(self._lib.llama_state_seq_set_data(llm.ctx, kept.state, kept.nbytes, 0)) != kept.nbytes:
            llm._ctx.kv_cache_seq_rm(-1, 0, -1)
            return False
        llm.input_ids[:keep] = kept.token_ids[:keep]
        llm.n_tokens = keep
        return True

    def decode_completion(self, completion_ids: Sequence[int], prompt_ids: Sequence[int]) -> str:
        return self._llm.detokenize(list(completion_ids), prev_tokens=list(prompt_ids)).decode(
            "utf-8", "replace"
        )

    def piece(self, token_id: int) -> str:
        return self._llm.detokenize([token_id]).decode("utf-8", "replace")

    # -- Backend -----------------------------------------------------------------------------------------------
    def tokenize(self, prompt: str | tuple[Message, ...], assistant_prefix: str = "") -> list[int]:
        """Token ids of a prompt: BOS when the model adds one, then a text prompt as plain text; chat messages
        rendered with the GGUF's own chat template (as ``create_chat_completion`` does), whose markers are special
        tokens while the messages' text and ``assistant_prefix`` are plain text only, so a marker inside a question
        or passage cannot forge a turn (:mod:`ragate.backends.template`)."""
        check_text(prompt, assistant_prefix)
        llm = self._llm
        if isinstance(prompt, str):
            bos = llm.token_bos()
            prefix = [bos] if llm._model.add_bos_token() and bos != -1 else []
            return prefix + self._plain(prompt + assistant_prefix)
        assert self._chat is not None  # checked by Backend.check
        chat = self._chat
        ids: list[int] = []
        for seg in chat_segments(lambda msgs: chat(messages=msgs).prompt, prompt, assistant_prefix):
            text = seg.text.encode("utf-8")
            ids += llm.tokenize(text, add_bos=False, special=True) if seg.template else self._plain(seg.text)
        return ids

    def _plain(self, text: str) -> list[int]:
        """``text`` as plain text: a special token's spelling in it is tokenised like any other characters."""
        return list(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def _generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return [self._decode(request) for request in requests]

    def _decode(
        self, request: GenerationRequest, watch: Watch | None = None, recompute: bool = False
    ) -> Generation:
        prompt_ids = self.tokenize(request.prompt, request.assistant_prefix)
        check_prompt_fits(len(prompt_ids), self.max_context, "shorten the prompt or load with a larger n_ctx")
        source = Recompute(self) if recompute else self
        return decode(source, request, prompt_ids, max_context=self.max_context, watch=watch)

    def generate_watched(
        self, request: GenerationRequest, watch: Watch, *, recompute: bool = False
    ) -> Generation:
        self.check(request)
        return self._decode(request, watch, recompute)

    def clear_cache(self) -> None:
        self._llm.reset()

    def twin(self, *, step_tokens: int | None = None, prompt_state_bytes: int = 0) -> LlamaCppBackend:
        """Another context over the same GGUF file (its weights are memory-mapped, so the pages are shared): a
        key/value cache of its own, for background work that must not evict this one's (a pipeline's shadow
        answers). The same name, context size and thread settings; ``step_tokens`` as in the constructor."""
        n_threads, n_threads_batch = self._thread_args
        return LlamaCppBackend(
            self._path, name=self.model, n_ctx=self.max_context, n_threads=n_threads,
            n_threads_batch=n_threads_batch, prompt_state_bytes=prompt_state_bytes, step_tokens=step_tokens,
        )  # fmt: skip

    def close(self) -> None:
        states = getattr(self, "_states", None)
        if states is not None:
            states.clear()
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is not None:
            llm.close()
