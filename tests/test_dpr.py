"""DPR-AIS on a real dense index (MiniLM + FAISS) of a small Wikipedia-style corpus, checked by brute force."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragate.selection.ais import ais_scores
from ragate.selection.dpr import dpr_ais, fixed_split, merge_by_id, rerank_scores

QUESTION = "Who discovered penicillin?"
PSEUDO = "Penicillin was discovered by the Scottish physician Alexander Fleming in 1928 in London."


@pytest.fixture
def dense(wiki_dense: Any) -> Any:
    return wiki_dense


@pytest.mark.parametrize("score", ["cos", "sum", "dynamic"])
def test_dpr_ais_equals_brute_force_over_the_merged_pool(dense: Any, score: str) -> None:
    kept = dpr_ais(dense, QUESTION, PSEUDO, n=5, k=3, score=score)  # type: ignore[arg-type]
    q_hits, p_hits = dense.search([QUESTION, PSEUDO], 5)
    pool = merge_by_id(q_hits, p_hits)
    assert len({h.id for h in pool}) == len(pool) <= 10
    q_vec, p_vec = dense.encoder.encode_queries([QUESTION, PSEUDO])
    docs = dense.passage_embeddings([h.id for h in pool])
    expected = ais_scores(docs @ q_vec, docs @ p_vec, score, qp_similarity=float(q_vec @ p_vec))  # type: ignore[arg-type]
    best = [pool[i].id for i in np.argsort(-expected, kind="stable")[:3]]
    assert [s.hit.id for s in kept] == best
    assert [s.score for s in kept] == sorted((s.score for s in kept), reverse=True)
    assert "Fleming" in kept[0].hit.passage.text or "penicillin" in kept[0].hit.passage.text.lower()


def test_single_path_ablation_and_fixed_split(dense: Any) -> None:
    only_q = dpr_ais(dense, QUESTION, PSEUDO, n=5, k=3, paths="question")
    q_top10 = {h.id for h in dense.search([QUESTION], 10)[0]}
    assert {s.hit.id for s in only_q} <= q_top10
    two_one = fixed_split(dense, QUESTION, PSEUDO, from_question=2, from_pseudo=1)
    q_hits, p_hits = dense.search([QUESTION, PSEUDO], 3)
    assert [h.id for h in two_one[:2]] == [h.id for h in q_hits[:2]]
    assert len({h.id for h in two_one}) == 3 and two_one[2].id in {h.id for h in p_hits}


def test_dpr_ais_needs_embeddings(wiki_passages: list[Any], tmp_path: Path) -> None:
    from ragate.retrieval.index import build_index, open_index

    build_index(wiki_passages, tmp_path / "bm25", "bm25", progress=False)
    with open_index(tmp_path / "bm25") as bm25, pytest.raises(ValueError, match="dense or hybrid"):
        dpr_ais(bm25, QUESTION, PSEUDO)


def test_dpr_ais_embeds_its_two_queries_once_and_a_batch_is_reused_only_whole(
    dense: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DPR-AIS searches with [question, pseudo-context] and then compares the same two vectors with the
    documents': the encoder runs once for both. A batch is looked up whole, so the question alone is embedded
    alone (a vector never depends on which batch came first)."""
    encoder = dense.encoder
    seen: list[tuple[str, ...]] = []
    real = type(encoder).encode_queries

    def counted(self: Any, texts: Any, **kw: Any) -> Any:
        seen.append(tuple(texts))
        return real(self, texts, **kw)

    monkeypatch.setattr(type(encoder), "encode_queries", counted)
    question, pseudo = QUESTION + " (issue O)", PSEUDO + " (issue O)"  # not embedded by another test
    kept = dpr_ais(dense, question, pseudo, n=5, k=3)
    assert seen == [(question, pseudo)] and kept
    alone = dense.embed_queries([question])
    assert seen == [(question, pseudo), (question,)]
    assert np.array_equal(alone, real(encoder, [question]))
    again = dense.embed_queries([question, pseudo])
    again[:] = 0  # a caller's copy: the kept vectors stay
    assert np.array_equal(dense.embed_queries([question, pseudo]), real(encoder, [question, pseudo]))
    assert len(seen) == 2


def test_rerank_scores_sum() -> None:
    assert list(rerank_scores(np.array([1.0, -2.0]), np.array([0.5, 3.0]))) == [1.5, 1.0]


def test_rerank_with_a_cross_encoder_sums_its_raw_scores(dense: Any, cross_encoder_dir: Path) -> None:
    from sentence_transformers import CrossEncoder

    from ragate.backends.scripted import ScriptedBackend, make_generation
    from ragate.methods import SelectorSpec, get_method, run_method

    spec = get_method("dpr-ais-rerank")
    spec = spec.with_(selector=SelectorSpec("dpr-ais-rerank", cross_encoder=str(cross_encoder_dir)))
    lm = ScriptedBackend([make_generation([PSEUDO], [-0.1]), make_generation(["Alexander Fleming"], [-0.1])])
    trace = run_method(spec, QUESTION, lm, dense)
    pool = merge_by_id(*dense.search([QUESTION, PSEUDO], 5))
    ce = CrossEncoder(str(cross_encoder_dir), device="cpu")  # independent load, default (sigmoid-free) scores
    import torch

    ce.activation_fn = torch.nn.Identity()
    texts = [h.passage.contents for h in pool]
    expected = ce.predict([(QUESTION, t) for t in texts]) + ce.predict([(PSEUDO, t) for t in texts])
    best = np.argsort(-expected, kind="stable")[:3]
    assert [d.id for d in trace.documents] == [pool[i].id for i in best]
    assert [d.score for d in trace.documents] == pytest.approx([float(expected[i]) for i in best], abs=1e-5)
    assert trace.answer == "Alexander Fleming" and trace.queries == (QUESTION, PSEUDO)


def test_rerank_names_a_missing_cross_encoder(dense: Any, tmp_path: Path) -> None:
    from ragate.errors import ModelNotFoundError
    from ragate.methods.runner import load_cross_encoder

    with pytest.raises(ModelNotFoundError, match="not a local directory"):
        load_cross_encoder(str(tmp_path / "nope"))


def test_rerank_methods_refuse_to_run_without_a_cross_encoder_before_any_lm_call(dense: Any) -> None:
    """Issue M: without a cross-encoder dpr-ais-rerank silently ranked by the bi-encoder and the results page
    called that a rerank. It now names the fix, and the bi-encoder form has its own name."""
    from ragate.backends.scripted import ScriptedBackend
    from ragate.errors import RagateError
    from ragate.methods import get_method, run_method

    for name in ("dpr-ais-rerank", "rerank"):
        lm = ScriptedBackend([])
        with pytest.raises(RagateError, match="--cross-encoder DIR.*dpr-ais-sum"):
            run_method(get_method(name), QUESTION, lm, dense)
        assert lm.calls == []


def test_dpr_ais_sum_ranks_the_pool_by_the_two_cosines(dense: Any) -> None:
    """What dpr-ais-rerank computed without a cross-encoder before issue M: K(d,q) + K(d,p) with the bi-encoder."""
    from ragate.backends.scripted import ScriptedBackend, make_generation
    from ragate.methods import get_method, run_method

    lm = ScriptedBackend([make_generation([PSEUDO], [-0.1]), make_generation(["Alexander Fleming"], [-0.1])])
    trace = run_method(get_method("dpr-ais-sum"), QUESTION, lm, dense)
    pool = merge_by_id(*dense.search([QUESTION, PSEUDO], 5))
    q_vec, p_vec = dense.encoder.encode_queries([QUESTION, PSEUDO])
    docs = dense.passage_embeddings([h.id for h in pool])
    expected = rerank_scores(docs @ q_vec, docs @ p_vec)
    assert [d.id for d in trace.documents] == [pool[i].id for i in np.argsort(-expected, kind="stable")[:3]]


def test_rerank_baseline_reorders_the_questions_top_10_by_the_cross_encoder(
    dense: Any, cross_encoder_dir: Path
) -> None:
    import torch
    from sentence_transformers import CrossEncoder

    from ragate.backends.scripted import ScriptedBackend, make_generation
    from ragate.eval.run import EvalConfig

    spec = EvalConfig(dataset="demo", methods=("rerank",), cross_encoder=str(cross_encoder_dir)).spec(
        "rerank"
    )
    assert spec.selector.cross_encoder == str(cross_encoder_dir) and spec.selector.n == 10
    lm = ScriptedBackend([make_generation(["Alexander Fleming"], [-0.1])])
    from ragate.methods import run_method

    trace = run_method(spec, QUESTION, lm, dense)
    pool = dense.search([QUESTION], 10)[0]
    ce = CrossEncoder(str(cross_encoder_dir), device="cpu")
    ce.activation_fn = torch.nn.Identity()
    expected = ce.predict([(QUESTION, h.passage.contents) for h in pool])
    assert [d.id for d in trace.documents] == [pool[i].id for i in np.argsort(-expected, kind="stable")[:3]]
    assert len(lm.calls) == 1 and trace.queries == (QUESTION,)
