"""Exact reuse of evaluated prompts: a prompt that shares a prefix with an earlier one starts from its key/value
state, with the same logits to the last bit as evaluating it all from an empty cache.

llama.cpp's CPU kernels multiply a batch of prompt tokens in groups of rows (four in the Q4_K kernels), and a
token's numbers depend on where its group starts: a prompt evaluated as a cached prefix plus the rest gives the same
logits bit for bit when the prefix length is a multiple of the group size, and slightly different ones otherwise
(measured on Qwen2.5-Coder-1.5B Q4_K_M: splits at 16, 32, 64, 100, 256, 320, 352, 364, 368 and 372 tokens gave
identical logits, at 1, 33, 370 and 373 not; SmolLM2-135M Q4_1 has no such kernel and splits anywhere;
`benchmarks/prefix_reuse.py` prints the check). Reuse is therefore cut down to a multiple of :data:`PREFIX_ALIGN`,
four times the group size measured, so a kernel that groups 8 or 16 rows is covered too. A batch of fewer than 8
tokens takes yet another path (an aligned split that left 1-7 tokens to evaluate differed, one that left 8 or more
did not), so at least :data:`MIN_SUFFIX` tokens, again four times that, are evaluated after a restored prefix. A
prompt seen before, token for token, is restored whole with the logits its evaluation ended with (kept beside its
state): the same numbers, with nothing evaluated (TARG's N samples after its greedy draft, a question asked again).
Then a call's output does not depend on which calls ran before it, and the call cache (:mod:`ragate.eval.calls`)
may store it.

:class:`PromptStates` keeps the states (an engine's opaque bytes) of the latest prompts up to a byte budget and finds
the one to start a new prompt from. It knows nothing of the engine; :class:`~ragate.backends.llamacpp.LlamaCppBackend`
saves and restores the states.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragate.backends.decoding import common_prefix_len

PREFIX_ALIGN = 16
MIN_SUFFIX = 32
DEFAULT_STATE_BYTES = 512 * 2**20


@dataclass(frozen=True)
class KeptPrompt:
    """One evaluated prompt: its token ids, the engine's state after it, the logits its last token gave (None: not
    kept), and what evaluating the whole prompt from an empty cache took (seconds; a share reused from an earlier
    state is counted at what it took then). ``nbytes`` is the state's size, :attr:`footprint` with the logits."""

    token_ids: tuple[int, ...]
    state: Any  # the engine's bytes (a ctypes array for llama.cpp)
    nbytes: int
    seconds: float
    cpu_seconds: float
    logits: Any = None  # a float array over the vocabulary
    hidden: Any = None  # the last token's last-layer hidden state (kept where it was asked for)

    @property
    def footprint(self) -> int:
        """The bytes it holds: its state and its logits."""
        extra = sum(int(a.nbytes) for a in (self.logits, self.hidden) if a is not None)
        return self.nbytes + extra

    def share(self, keep: int) -> tuple[float, float]:
        """What the first ``keep`` tokens took, apportioned by token count: (wall, CPU) seconds."""
        frac = keep / len(self.token_ids)
        return self.seconds * frac, self.cpu_seconds * frac


@dataclass
class PrefixReuse:
    """What the prompts evaluated inside one reuse block took from kept states (mutable: it fills while the block
    runs): tokens not evaluated again, and what they took when they were evaluated."""

    tokens: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0


def reusable(
    kept: Sequence[int], token_ids: Sequence[int], align: int = PREFIX_ALIGN, min_suffix: int = MIN_SUFFIX
) -> int:
    """How many leading tokens of ``token_ids`` may come from ``kept``'s state: their common prefix, leaving at least
    ``min_suffix`` tokens to evaluate, cut down to a multiple of ``align``."""
    common = min(common_prefix_len(kept, token_ids), len(token_ids) - min_suffix)
    return max(0, common) // align * align


class PromptStates:
    """The states of the latest evaluated prompts, newest last, within ``max_bytes`` (0 keeps none)."""

    def __init__(self, max_bytes: int = DEFAULT_STATE_BYTES, align: int = PREFIX_ALIGN) -> None:
        if max_bytes < 0 or align < 1:
            raise ValueError(f"max_bytes must be >= 0 and align >= 1, not {max_bytes} and {align}")
        self.max_bytes, self.align = max_bytes, align
        self._kept: OrderedDict[tuple[int, ...], KeptPrompt] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def keeps(self, n_tokens: int) -> bool:
        """Whether a prompt of ``n_tokens`` would be kept (so an engine need not copy its state otherwise)."""
        return self.max_bytes > 0 and n_tokens >= self.align

    def whole(self, token_ids: Sequence[int]) -> KeptPrompt | None:
        """The kept prompt equal to ``token_ids`` with its last logits, if any (it becomes the newest)."""
        found = self._kept.get(tuple(token_ids))
        if found is None or found.logits is None:
            return None
        self._kept.move_to_end(found.token_ids)
        return found

    def best(self, token_ids: Sequence[int]) -> tuple[int, KeptPrompt | None]:
        """The kept prompt sharing the longest reusable prefix with ``token_ids``, and that prefix's length
        ((0, None) when none shares at least ``align`` tokens). The one chosen becomes the newest."""
        keep, found = 0, None
        for kept in self._kept.values():
            n = reusable(kept.token_ids, token_ids, self.align)
            if n > keep:
                keep, found = n, kept
        if found is not None:
            self._kept.move_to_end(found.token_ids)
        return keep, found

    def add(self, kept: KeptPrompt) -> None:
        """Keep ``kept`` as the newest, dropping the oldest beyond the byte budget (a prompt larger than the whole
        budget is not kept)."""
        old = self._kept.pop(kept.token_ids, None)
        if old is not None:
            self._bytes -= old.footprint
        if kept.footprint > self.max_bytes or not self.keeps(len(kept.token_ids)):
            return
        self._kept[kept.token_ids] = kept
        self._bytes += kept.footprint
        while self._bytes > self.max_bytes:
            _, dropped = self._kept.popitem(last=False)
            self._bytes -= dropped.footprint

    def clear(self) -> None:
        self._kept.clear()
        self._bytes = 0
