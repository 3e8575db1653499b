"""SKR, kNN form (Wang et al. 2023, "Self-Knowledge Guided Retrieval Augmentation", sections 3.1-3.2).

Self-knowledge is collected on *training* questions: a question is labelled "retrieve" when the model's answer
with retrieval scores higher than its closed-book answer (section 3.1: M(q) wrong, M(q, R) right, for 0/1
metrics), "known" otherwise. A new question is embedded with the index's encoder; its ``k`` nearest labelled
questions by cosine vote, and the score is the share voting "retrieve" (section 3.2, kNN). SKR retrieves when
the "unknown" neighbours outnumber the "known" ones, i.e. share > 0.5, ragate's default tau; the share is a score
like any other gate's, so it can be swept and calibrated to a budget.

ragate takes the labels from `ragate sweep` pass-1 records (closed-book and retrieval answers of one method
family), so they match the answers the method will give. ``ragate skr fit`` stores them as one ``.npz`` file of
plain arrays (read with ``allow_pickle=False``) that records the encoder, the model and the dataset file.
A label set is refused with another encoder or model, and a question never votes on itself: a label set's own
questions are excluded from their neighbours (leave-one-out), and `ragate eval` / `sweep` refuse a test split
that shares questions with the training split.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import re
import unicodedata
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ragate.errors import RagateError
from ragate.fileio import atomic_writer
from ragate.gates.base import Gate, GateContext, GateDecision

FORMAT = "ragate-skr-labels"
FORMAT_VERSION = 1
DEFAULT_SKR_TAU = 0.5
DEFAULT_NEIGHBOURS = 10


def question_key(question: str) -> str:
    """A question's identity across files: NFKC, case-folded, white space folded, trailing "?" dropped."""
    text = unicodedata.normalize("NFKC", question).casefold()
    return re.sub(r"\s+", " ", text).strip().rstrip("?").strip()


def needs_retrieval(record: Mapping[str, Any], metric: str = "em") -> bool:
    """SKR's label of one sweep record: the retrieval answer scores higher than the closed-book answer."""
    return float(record["open"]["scores"][metric]) > float(record["closed"]["scores"][metric])


@dataclass(frozen=True, eq=False)
class LabelSet:
    """Labelled training questions: ``embeddings`` (n x d, L2-normalised), ``retrieve`` (n bools), the ids and
    texts, and ``meta`` (encoder, model, dataset files, family, metric, where the records came from)."""

    ids: tuple[str, ...]
    questions: tuple[str, ...]
    retrieve: np.ndarray
    embeddings: np.ndarray
    meta: Mapping[str, Any]

    def __post_init__(self) -> None:
        n = len(self.ids)
        if not (len(self.questions) == n == len(self.retrieve) == len(self.embeddings)):
            raise RagateError("an SKR label set needs one id, question, label and embedding per question")
        if n == 0:
            raise RagateError("an SKR label set needs at least one labelled question")

    @functools.cached_property
    def content_sha256(self) -> str:
        """What the vote depends on (ids, texts, labels, embeddings), hashed: unlike the file's sha256 it is the
        same for two fits of the same records (an ``.npz`` zip stamps its members' times)."""
        digest = hashlib.sha256()
        digest.update(json.dumps([self.ids, self.questions], ensure_ascii=False).encode())
        digest.update(np.asarray(self.retrieve, dtype=bool).tobytes())
        digest.update(np.ascontiguousarray(self.embeddings, dtype=np.float32).tobytes())
        return digest.hexdigest()

    @functools.cached_property
    def keys(self) -> frozenset[str]:
        return frozenset(question_key(q) for q in self.questions)

    def overlap(self, questions: Sequence[str]) -> list[str]:
        """The given questions that are also training questions here (by :func:`question_key`)."""
        return [q for q in questions if question_key(q) in self.keys]


def vote(
    query: np.ndarray, labels: LabelSet, k: int = DEFAULT_NEIGHBOURS, *, exclude: str | None = None
) -> tuple[float, int, int]:
    """The share of the ``k`` nearest labelled questions (cosine) labelled "retrieve", how many voted, and how
    many were excluded as the question itself (``exclude``: its text). Section 3.2's kNN elicitation."""
    if k < 1:
        raise RagateError(f"SKR needs k >= 1 neighbours, not {k}")
    sims = labels.embeddings @ np.asarray(query, dtype=np.float32).reshape(-1)
    excluded = 0
    if exclude is not None:
        key = question_key(exclude)
        same = np.array([question_key(q) == key for q in labels.questions])
        excluded = int(same.sum())
        sims = np.where(same, -np.inf, sims)
    available = len(sims) - excluded
    if available <= 0:
        raise RagateError("the SKR label set holds no question other than this one: fit it on more questions")
    take = min(k, available)
    nearest = np.argsort(-sims, kind="stable")[:take]
    return float(labels.retrieve[nearest].mean()), take, excluded


def skr_decision(share: float, tau: float, voters: int, excluded: int = 0) -> GateDecision:
    """Retrieve iff the share of neighbours labelled "retrieve" exceeds ``tau``."""
    retrieve = share > tau
    note = (
        f"; the question itself ({excluded} training cop{'y' if excluded == 1 else 'ies'}) did not vote"
        if excluded
        else ""
    )
    return GateDecision(
        retrieve,
        share,
        tau,
        f"{round(share * voters)} of the {voters} nearest training questions needed retrieval: share {share:.2f} "
        f"{'>' if retrieve else '<='} tau = {tau:g}{note}",
    )


def save_labels(labels: LabelSet, path: str | Path) -> Path:
    """Write ``labels`` as one ``.npz`` of plain arrays (no pickle), atomically."""
    path = Path(path)
    buffer = io.BytesIO()
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **labels.meta}
    np.savez(
        buffer,
        ids=np.array(labels.ids, dtype=str),
        questions=np.array(labels.questions, dtype=str),
        retrieve=np.asarray(labels.retrieve, dtype=bool),
        embeddings=np.asarray(labels.embeddings, dtype=np.float32),
        meta=np.array(json.dumps(meta, ensure_ascii=False)),
    )
    with atomic_writer(path) as f:
        f.write(buffer.getvalue())
    return path


def load_labels(path: str | Path) -> LabelSet:
    """Read a label set written by :func:`save_labels`; anything else is a named error."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise RagateError(
            f"SKR label set {str(path)!r} not found: fit one with `ragate skr fit --sweep SWEEP_DIR --out FILE`"
        )
    stat = path.stat()
    return _load(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _load(path: str, mtime_ns: int, size: int) -> LabelSet:  # keyed by mtime and size: a refit is re-read
    fix = "fit it again with `ragate skr fit`"
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"])) if "meta" in data.files else {}
            if (
                not isinstance(meta, dict)
                or meta.get("format") != FORMAT
                or meta.get("format_version") != FORMAT_VERSION
            ):
                raise RagateError(
                    f"{path} is not an SKR label set of format {FORMAT} v{FORMAT_VERSION}; {fix}"
                )
            arrays = {k: data[k] for k in ("ids", "questions", "retrieve", "embeddings")}
    except (
        OSError,
        ValueError,
        KeyError,
        EOFError,
        RuntimeError,  # a member flagged as encrypted (RecursionError, deep JSON, is one too)
        NotImplementedError,  # a member of an unknown compression method
        zipfile.BadZipFile,
        zlib.error,
    ) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise RagateError(f"{path} is not an SKR label set ({type(err).__name__}: {err}); {fix}") from None
    fault = _label_set_fault(arrays, meta)
    if fault is not None:
        raise RagateError(f"{path}: damaged label set: {fault}; {fix}")
    return LabelSet(
        tuple(str(x) for x in arrays["ids"]),
        tuple(str(x) for x in arrays["questions"]),
        arrays["retrieve"],
        arrays["embeddings"],
        meta,
    )


def _label_set_fault(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> str | None:
    """What is wrong with a label set's arrays and record, else None: one id, question (text), label (bool) and
    finite float32 embedding (of the dimension its encoder records) per question, at least one question; its
    encoder and model recorded as objects."""
    emb, retrieve = arrays["embeddings"], arrays["retrieve"]
    if emb.ndim != 2 or emb.dtype != np.float32 or retrieve.dtype != bool or retrieve.ndim != 1:
        return f"embeddings {emb.dtype} {emb.shape}, labels {retrieve.dtype} {retrieve.shape}"
    texts = [arrays["ids"], arrays["questions"]]
    if any(a.ndim != 1 or a.dtype.kind != "U" for a in texts):
        return f"ids {texts[0].dtype} {texts[0].shape} and questions {texts[1].dtype} {texts[1].shape} are not text"
    if not len(texts[0]) == len(texts[1]) == len(retrieve) == len(emb) >= 1:
        return (
            f"{len(texts[0])} ids, {len(texts[1])} questions, {len(retrieve)} labels, {len(emb)} embeddings"
        )
    if not np.all(np.isfinite(emb)):
        return "embeddings hold NaN or infinity"
    encoder, model = meta.get("encoder") or {}, meta.get("model") or {}
    if not isinstance(encoder, dict) or not isinstance(model, dict):
        return f"its encoder ({encoder!r}) and model ({model!r}) must be objects"
    dim = encoder.get("dim")
    if dim is not None and dim != emb.shape[1]:
        return f"embeddings of dimension {emb.shape[1]}, but its encoder's is {dim!r}"
    for text in (*texts[0], *texts[1]):
        try:
            str(text).encode("utf-8")
        except UnicodeEncodeError:
            return f"{str(text)!r} holds a lone surrogate, which is not text"
    return None


def check_encoder(labels: LabelSet, encoder: Mapping[str, Any] | None, where: str) -> None:
    """A label set's questions were embedded by one encoder; a query embedded by another is in another space."""
    built = labels.meta.get("encoder") or {}
    if encoder is None:
        raise RagateError(
            f"SKR embeds the question with the index's encoder, and {where} has none (a bm25 index): use a dense "
            "or hybrid index"
        )
    keys = ("name", "dim", "query_prefix")
    if any(built.get(k) != encoder.get(k) for k in keys):
        raise RagateError(
            f"the SKR label set was embedded with encoder {built.get('name')!r} (dim {built.get('dim')}), but "
            f"{where} embeds with {encoder.get('name')!r} (dim {encoder.get('dim')}): refit the labels with this "
            "index (`ragate skr fit --index ...`)"
        )


def check_model(labels: LabelSet, model: Mapping[str, Any]) -> None:
    """Labels say what one model knows; another model's self-knowledge differs. Same file (sha256) where both
    name a file, else the same engine and model name."""
    fitted = labels.meta.get("model") or {}
    if fitted.get("sha256") and model.get("sha256"):
        same = fitted["sha256"] == model["sha256"]
    else:
        same = (fitted.get("engine"), fitted.get("model")) == (model.get("engine"), model.get("model"))
    if not same:
        raise RagateError(
            f"the SKR label set records what model {fitted.get('model')!r} ({fitted.get('engine')}) knows, but "
            f"this run uses {model.get('model')!r} ({model.get('engine')}): a sweep of this model gives its labels "
            "(`ragate sweep ... --model M` then `ragate skr fit`)"
        )


class SKR(Gate):
    """SKR's kNN vote with the label set ``GateSpec.labels`` names, checked against the index's encoder and this
    model; the question never votes on itself. No generation: the direct answer follows a "no"."""

    description = "SKR: the k = 10 nearest labelled training questions vote on retrieval (needs --skr-labels)"
    default_tau = DEFAULT_SKR_TAU
    tau_source = "SKR section 3.2: retrieve when 'unknown' neighbours outnumber 'known' ones"
    needs_embeddings = True
    budget_control = False
    calibration_note = (
        "calibrate does not take SKR's label set: its score is the share of its k = 10 neighbours voting "
        "'retrieve' (11 values), so sweep it instead (`ragate sweep --methods skr --skr-labels FILE ...`) and "
        "read the threshold for a budget from sweep.json, or pass --threshold skr=TAU"
    )
    like = "skr"

    def decide(self, ctx: GateContext, tau: float) -> GateDecision:
        p = ctx.params
        if p.labels is None:
            raise RagateError(
                "skr needs a label set of training questions: run `ragate sweep` on a training split, then "
                "`ragate skr fit --sweep DIR --out FILE`, and pass --skr-labels FILE"
            )
        labels = load_labels(p.labels)
        check_encoder(labels, ctx.encoder_identity(), "this index")
        check_model(labels, ctx.model_identity())
        with ctx.timed("skr-vote", overhead=True):
            share, voters, excluded = vote(
                ctx.embed([ctx.question])[0], labels, p.neighbours, exclude=ctx.question
            )
        return skr_decision(share, tau, voters, excluded)
