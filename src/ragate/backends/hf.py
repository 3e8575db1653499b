"""Hugging Face transformers backend: the engine for attention-based methods (DRAGIN, ETC's attention query).

Loads a local model directory or a GGUF file (dequantised to float32 by transformers; needs the ``gguf``
package). Decoding runs ragate's own loop (:mod:`ragate.backends.decoding`) over the model's forward pass with a
key/value cache that is kept between requests: a request whose prompt extends the previous sequence (the N samples
of TARG's variance gate, a draft continued after a gate) only pays for the new tokens. Greedy output equals
``model.generate(do_sample=False)`` token for token. Requests in a batch run one after another (CPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ragate.backends.base import Backend, Capabilities, check_text
from ragate.backends.decoding import Recompute, Watch, check_prompt_fits, common_prefix_len, decode
from ragate.backends.template import chat_segments
from ragate.errors import ModelNotFoundError, RagateError
from ragate.types import Generation, GenerationRequest

MAX_TOP_K = 100


def _import_transformers() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as err:
        raise RagateError(
            "the transformers backend needs torch and transformers: run `pip install torch==2.13.0` "
            "(the local CPU wheel) and `pip install 'ragate[transformers]'`"
        ) from err
    return torch, transformers


class TransformersBackend(Backend):
    """A causal LM run by transformers on the CPU, with per-token logprobs, top-k, exact entropy and attentions."""

    engine = "transformers"

    def __init__(
        self,
        model_path: str | Path,
        *,
        name: str | None = None,
        max_context: int | None = None,
        n_threads: int | str | None = None,
    ) -> None:
        """``n_threads``: torch's intra-op threads for the whole process (``torch.set_num_threads``: the encoder
        shares them); None or "auto" leaves torch's own default (one per physical core)."""
        from ragate.backends.threads import check_threads

        try:
            threads = check_threads(n_threads, "n_threads")
        except ValueError as err:
            raise RagateError(str(err)) from None
        torch, transformers = _import_transformers()
        if threads is not None:
            torch.set_num_threads(threads)
        path = Path(model_path)
        if not path.exists():
            raise ModelNotFoundError(
                f"no model at {path}: give a GGUF file or a model directory with config.json"
            )
        source, extra = (path.parent, {"gguf_file": path.name}) if path.is_file() else (path, {})
        self._torch = torch
        self._tok = transformers.AutoTokenizer.from_pretrained(source, **extra)
        # eager attention so that attentions can be returned on request
        self._model = transformers.AutoModelForCausalLM.from_pretrained(
            source, dtype=torch.float32, attn_implementation="eager", **extra
        ).eval()
        self.model = name or str(path)
        config = self._model.config
        self.max_context = max_context or int(getattr(config, "max_position_embeddings", 2048))
        self.eos_token_ids = _eos_ids(self._tok, self._model)
        self.capabilities = Capabilities(
            logprobs=True,
            top_k=MAX_TOP_K,
            attentions=True,
            sampling=True,
            chat_template=bool(getattr(self._tok, "chat_template", None)),
            full_distribution=True,
            token_ids=True,
            prefix_cache=True,
            hidden_states=True,
        )
        self._hidden: np.ndarray | None = None  # set by next_logits when asked for (hidden_state)
        self._cache_ids: list[int] = []
        self._past: Any = None

    @property
    def hf_model(self) -> Any:
        """The underlying transformers model (for callers that need the engine's own API)."""
        return self._model

    @property
    def hf_tokenizer(self) -> Any:
        return self._tok

    # -- LogitSource -------------------------------------------------------------------------------------------
    def is_end(self, token_id: int) -> bool:
        return token_id in self.eos_token_ids

    def next_logits(self, token_ids: Sequence[int]) -> np.ndarray:
        torch = self._torch
        keep = common_prefix_len(self._cache_ids, token_ids)
        if keep == len(token_ids):
            keep -= 1  # re-run the last token to get its logits
        if self._past is not None and keep > 0:
            extra = self._past.get_seq_length() - keep
            if extra > 0:
                self._past.crop(
                    -extra
                )  # a negative argument removes that many tokens (transformers 4.x and 5.x)
        else:
            self._past, keep = None, 0
        step = self.step if self.step is not None else contextlib.nullcontext
        with step(), torch.inference_mode():
            out = self._model(
                input_ids=torch.tensor([list(token_ids[keep:])], dtype=torch.long),
                past_key_values=self._past,
                use_cache=True,
                logits_to_keep=1,
                output_hidden_states=self._hidden is not None,
            )
        if self._hidden is not None:
            self._hidden = out.hidden_states[-1][0, -1].float().numpy().copy()
        self._past = out.past_key_values
        self._cache_ids = list(token_ids)
        return out.logits[0, -1].float().numpy()

    def hidden_state(self, prompt: str | tuple[Any, ...], assistant_prefix: str = "") -> np.ndarray:
        """The last-layer hidden state (transformers' last ``hidden_states``, after the final norm) at the prompt's
        last token, from a forward pass over the prompt that leaves its key/value cache for a generation of the same
        prompt (which then evaluates only its last token again)."""
        ids = self.tokenize(prompt, assistant_prefix)
        check_prompt_fits(len(ids), self.max_context, "shorten the prompt")
        self._hidden = np.zeros(0, dtype=np.float32)  # ask next_logits for it
        try:
            self.next_logits(ids)
            return self._hidden.astype(np.float32)
        finally:
            self._hidden = None

    def decode_completion(self, completion_ids: Sequence[int], prompt_ids: Sequence[int]) -> str:
        return str(
            self._tok.decode(
                list(completion_ids), skip_special_tokens=True, clean_up_tokenization_spaces=False
            )
        )

    def piece(self, token_id: int) -> str:
        return str(
            self._tok.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        )

    # -- Backend -----------------------------------------------------------------------------------------------
    def tokenize(self, prompt: str | tuple[Any, ...], assistant_prefix: str = "") -> list[int]:
        """Token ids of a text prompt (with the model's special prefix, the text itself plain) or of chat messages
        (with its template, whose markers are special tokens while the messages' text and ``assistant_prefix`` are
        plain text only: :mod:`ragate.backends.template`)."""
        check_text(prompt, assistant_prefix)
        if isinstance(prompt, str):
            text = prompt + assistant_prefix
            return list(self._tok(text, add_special_tokens=True, split_special_tokens=True)["input_ids"])
        tok = self._tok

        def render(messages: list[dict[str, str]]) -> str:
            return str(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))

        ids: list[int] = []
        for seg in chat_segments(render, prompt, assistant_prefix):
            if seg.template:
                ids += list(tok(seg.text, add_special_tokens=False)["input_ids"])
            else:
                ids += self._plain(seg.text)
        return ids

    def _plain(self, text: str) -> list[int]:
        """``text`` as plain text: a special token's spelling in it is tokenised like any other characters."""
        return list(self._tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def _generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return [self._decode(request) for request in requests]

    def _decode(
        self, request: GenerationRequest, watch: Watch | None = None, recompute: bool = False
    ) -> Generation:
        prompt_ids = self.tokenize(request.prompt, request.assistant_prefix)
        check_prompt_fits(
            len(prompt_ids), self.max_context, "shorten the prompt (fewer or shorter documents)"
        )
        source = Recompute(self) if recompute else self
        gen = decode(source, request, prompt_ids, max_context=self.max_context, watch=watch)
        if request.attentions:
            attentions = self._attentions(prompt_ids + list(gen.token_ids), len(prompt_ids))
            gen = replace(gen, attentions=attentions)
        return gen

    def head_attentions(self, token_ids: Sequence[int]) -> np.ndarray:
        """The last layer's attention of ``token_ids`` run on their own (no cache, no prompt), per head:
        shape ``(heads, L, L)``, row i = what position i attends to. DRAGIN's trigger and query read it."""
        torch = self._torch
        with torch.inference_mode():
            out = self._model(
                input_ids=torch.tensor([list(token_ids)], dtype=torch.long),
                output_attentions=True,
                use_cache=False,
            )
        return np.asarray(out.attentions[-1][0].float().numpy(), dtype=np.float32)

    def token_spans(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids of plain ``text`` (no special tokens) and each token's character span in it."""
        enc = self._tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [(int(a), int(b)) for a, b in enc["offset_mapping"]]

    def _attentions(self, ids: list[int], n_prompt: int) -> np.ndarray:
        """Last layer's attention, averaged over heads, of each generated position over all positions."""
        torch = self._torch
        with torch.inference_mode():
            out = self._model(
                input_ids=torch.tensor([ids], dtype=torch.long), output_attentions=True, use_cache=False
            )
        last = out.attentions[-1][0].float().mean(dim=0)  # (L, L)
        return last[n_prompt:, :].numpy().astype(np.float32)

    def generate_watched(
        self, request: GenerationRequest, watch: Watch, *, recompute: bool = False
    ) -> Generation:
        self.check(request)
        return self._decode(request, watch, recompute)

    def clear_cache(self) -> None:
        self._past, self._cache_ids = None, []

    def close(self) -> None:
        self.clear_cache()


def _eos_ids(tokenizer: Any, model: Any) -> frozenset[int]:
    ids: set[int] = set()
    for value in (
        getattr(tokenizer, "eos_token_id", None),
        getattr(model.generation_config, "eos_token_id", None),
    ):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return frozenset(ids)
