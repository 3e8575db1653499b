"""The llama.cpp and transformers backends on the real default model (SmolLM2-135M-Instruct, GGUF).

Each backend is checked against its engine's own API: greedy text equals a direct ``llama_cpp.Llama`` /
``model.generate`` call, and every chosen-token logprob equals log-softmax of logits computed independently.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ragate.errors import CapabilityError, RagateError
from ragate.types import GenerationRequest, Message
from ragate.uncertainty import entropy, log_softmax

PROMPT = "The capital of France is"
CHAT = (Message("user", "What is the capital of France? Answer with one word."),)
N_TOKENS = 24


def check_alignment(gen: Any) -> None:
    assert (
        len(gen.tokens)
        == len(gen.token_ids)
        == len(gen.logprobs)
        == len(gen.offsets)
        == gen.completion_tokens
    )
    assert "".join(gen.text[s:e] for s, e in gen.offsets) == gen.text
    for lp, top, tid in zip(gen.logprobs, gen.top_logprobs, gen.token_ids, strict=True):
        assert lp <= 0
        assert [t.logprob for t in top] == sorted((t.logprob for t in top), reverse=True)
        assert top[0].token_id == tid, "under greedy decoding the chosen token is the top-1 alternative"
        assert top[0].logprob == pytest.approx(lp)


# ---- llama.cpp --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def direct_llama(smollm2_path: Any) -> Any:
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=str(smollm2_path), n_ctx=2048, logits_all=True, verbose=False)
    yield llm
    llm.close()


def test_llama_greedy_equals_direct_completion(llama_backend: Any, direct_llama: Any) -> None:
    [gen] = llama_backend.generate([GenerationRequest(PROMPT, max_tokens=N_TOKENS)])
    direct = direct_llama.create_completion(PROMPT, max_tokens=N_TOKENS, temperature=0.0, repeat_penalty=1.0)
    assert gen.text == direct["choices"][0]["text"]
    assert gen.completion_tokens == direct["usage"]["completion_tokens"]
    assert gen.prompt_tokens == direct["usage"]["prompt_tokens"]
    check_alignment(gen)


def test_llama_chat_greedy_equals_direct_chat_completion(llama_backend: Any, direct_llama: Any) -> None:
    [gen] = llama_backend.generate([GenerationRequest(CHAT, max_tokens=N_TOKENS)])
    direct = direct_llama.create_chat_completion(
        messages=[{"role": m.role, "content": m.content} for m in CHAT],
        max_tokens=N_TOKENS,
        temperature=0.0,
        repeat_penalty=1.0,
    )
    assert gen.text == direct["choices"][0]["message"]["content"]
    assert gen.text.strip()


def test_llama_logprobs_equal_log_softmax_of_logits(llama_backend: Any, direct_llama: Any) -> None:
    [gen] = llama_backend.generate([GenerationRequest(PROMPT, max_tokens=N_TOKENS, top_logprobs=5)])
    prompt_ids = llama_backend.tokenize(PROMPT)
    # Feed the tokens one at a time, as generation does: llama.cpp's quantised kernels give slightly different
    # logits (up to ~0.2 nats on SmolLM2 Q4_1) when the same positions are evaluated in one batch.
    direct_llama.reset()
    direct_llama.eval(prompt_ids)
    for tid in gen.token_ids:
        direct_llama.eval([tid])
    scores = np.array(direct_llama.scores[: direct_llama.n_tokens])  # logits_all: one row per position
    for t, tid in enumerate(gen.token_ids):
        row = scores[len(prompt_ids) - 1 + t]
        lp = log_softmax(row)
        assert gen.logprobs[t] == pytest.approx(lp[tid], abs=1e-4)
        assert gen.entropies[t] == pytest.approx(entropy(row), abs=1e-4)
        assert [a.token_id for a in gen.top_logprobs[t]] == list(np.argsort(-lp, kind="stable")[:5])


def test_llama_sampling_is_seeded(llama_backend: Any) -> None:
    req = GenerationRequest(PROMPT, max_tokens=12, temperature=0.7, seed=3)
    a, b = llama_backend.generate([req, req])
    assert a.text == b.text and a.token_ids == b.token_ids
    others = llama_backend.generate(
        [GenerationRequest(PROMPT, max_tokens=12, temperature=1.5, seed=s) for s in range(4)]
    )
    assert len({g.token_ids for g in others}) > 1


def test_llama_stop_strings_and_prefix_cache(llama_backend: Any) -> None:
    [full] = llama_backend.generate([GenerationRequest(PROMPT, max_tokens=N_TOKENS)])
    assert " " in full.text.strip(), "need a multi-word greedy answer for this test"
    stop = full.text.strip().split(" ")[1]
    [cut] = llama_backend.generate([GenerationRequest(PROMPT, max_tokens=N_TOKENS, stop=(stop,))])
    assert stop not in cut.text and cut.finish_reason == "stop"
    assert full.text.startswith(cut.text)
    # the cache from the previous request must not leak into an unrelated one
    [again] = llama_backend.generate([GenerationRequest(PROMPT, max_tokens=N_TOKENS)])
    assert again.text == full.text


def test_llama_refuses_attentions_with_a_clear_error(llama_backend: Any) -> None:
    with pytest.raises(CapabilityError, match="transformers"):
        llama_backend.generate([GenerationRequest(PROMPT, attentions=True)])


def test_llama_prompt_longer_than_context(llama_backend: Any) -> None:
    with pytest.raises(RagateError, match="context window"):
        llama_backend.generate([GenerationRequest("word " * 3000, max_tokens=4)])


# ---- transformers -----------------------------------------------------------------------------------------------


def test_hf_greedy_equals_direct_generate(hf_backend: Any) -> None:
    import torch

    [gen] = hf_backend.generate([GenerationRequest(PROMPT, max_tokens=N_TOKENS)])
    ids = hf_backend.tokenize(PROMPT)
    with torch.inference_mode():
        out = hf_backend.hf_model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=N_TOKENS,
            repetition_penalty=1.0,
        )
    new = out[0, len(ids) :].tolist()
    new = (
        [t for t in new if t not in hf_backend.eos_token_ids][: len(gen.token_ids)]
        if gen.finish_reason == "stop"
        else new
    )
    assert list(gen.token_ids) == new
    assert gen.text == hf_backend.hf_tokenizer.decode(
        new, skip_special_tokens=True, clean_up_tokenization_spaces=False
    )
    check_alignment(gen)


def test_hf_logprobs_equal_log_softmax_of_logits(hf_backend: Any) -> None:
    import torch

    [gen] = hf_backend.generate([GenerationRequest(PROMPT, max_tokens=12, top_logprobs=5)])
    ids = hf_backend.tokenize(PROMPT)
    with torch.inference_mode():  # one forward pass over everything, no cache: an independent computation
        logits = hf_backend.hf_model(torch.tensor([ids + list(gen.token_ids)])).logits[0].float().numpy()
    for t, tid in enumerate(gen.token_ids):
        row = logits[len(ids) - 1 + t]
        assert gen.logprobs[t] == pytest.approx(log_softmax(row)[tid], abs=1e-4)
        assert gen.entropies[t] == pytest.approx(entropy(row), abs=1e-3)
        assert gen.top_logprobs[t][0].token_id == tid


def test_hf_chat_sampling_and_attentions(hf_backend: Any) -> None:
    [chat] = hf_backend.generate([GenerationRequest(CHAT, max_tokens=8)])
    assert chat.text.strip()
    req = GenerationRequest(PROMPT, max_tokens=6, temperature=0.7, seed=11, attentions=True)
    a, b = hf_backend.generate([req, req])
    assert a.token_ids == b.token_ids
    n_prompt = len(hf_backend.tokenize(PROMPT))
    assert a.attentions.shape == (len(a), n_prompt + len(a))
    assert np.allclose(a.attentions.sum(axis=1), 1.0, atol=1e-4)  # each row is a distribution
    assert np.allclose(np.triu(a.attentions[:, n_prompt:], k=1), 0.0)  # causal: nothing after the token


def test_hf_loads_a_model_directory(hf_backend: Any, tmp_path: Any) -> None:
    """A transformers model directory (here: the default model saved with save_pretrained) works by path."""
    from ragate.backends.hf import TransformersBackend

    # transformers refuses to serialise a GGUF-loaded model as such; copy its (de-quantised) weights into a
    # plain model of the same config and save that.
    loaded = hf_backend.hf_model
    plain = type(loaded)(loaded.config)
    plain.load_state_dict(loaded.state_dict())
    plain.save_pretrained(tmp_path)
    hf_backend.hf_tokenizer.save_pretrained(tmp_path)
    request = GenerationRequest(PROMPT, max_tokens=8)
    with TransformersBackend(tmp_path, name="saved") as from_dir:
        [a] = from_dir.generate([request])
    [b] = hf_backend.generate([request])
    assert a.token_ids == b.token_ids and a.text == b.text


def test_llama_clear_cache_keeps_results(llama_backend: Any) -> None:
    [a] = llama_backend.generate([GenerationRequest(PROMPT, max_tokens=6)])
    llama_backend.clear_cache()
    [b] = llama_backend.generate([GenerationRequest(PROMPT, max_tokens=6)])
    assert a.token_ids == b.token_ids
