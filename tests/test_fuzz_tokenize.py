"""Fuzz: every text ragate tokenises (issue N). Any string a question, a passage or a pseudo-context can hold,
marker spellings, control characters and lone surrogates included, is either tokenised with the template's
markers as the only control tokens (a text never forges a turn) or refused with a RagateError that names the bad
character; never a UnicodeEncodeError from inside the engine. Real SmolLM2 on both local engines."""

from __future__ import annotations

from typing import Any

import pytest
from fuzzing import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from ragate.errors import RagateError
from ragate.types import Message

MARKERS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "[INST]", "\n", "\r\n", "\x00", "\ufeff")
texts = st.lists(
    st.one_of(st.sampled_from(MARKERS), st.text(max_size=12), st.sampled_from(["\ud800", "\udcff", "\udfff"])),
    max_size=8,
).map("".join)


@pytest.fixture(params=["llama_backend", "hf_backend"])
def lm(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(request.param)


def _specials(lm: Any, ids: list[int]) -> int:
    special = set(lm.hf_tokenizer.all_special_ids) if lm.engine == "transformers" else None
    if special is None:  # llama.cpp: a control token's piece is its marker spelling, parsed as one id
        special = {
            i for m in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
            for i in lm._llm.tokenize(m.encode(), add_bos=False, special=True)
        }  # fmt: skip
    return sum(i in special for i in ids)


@fuzz_settings
@given(texts, st.sampled_from(["user", "system"]), st.booleans())
def test_fuzz_tokenize(lm: Any, text: str, role: str, as_chat: bool) -> None:
    prompt: Any = (Message(role, text),) if as_chat else text  # type: ignore[arg-type]
    try:
        ids = lm.tokenize(prompt)
    except RagateError as err:
        assert "lone surrogate" in str(err)
        with pytest.raises(UnicodeEncodeError):
            text.encode("utf-8")
        return
    empty = lm.tokenize((Message(role, ""),) if as_chat else "")
    assert _specials(lm, ids) == _specials(lm, empty)  # the text added no control token
