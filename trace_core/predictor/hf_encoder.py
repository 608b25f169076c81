"""Optional GPU predictor: a small Hugging Face encoder (local path only) + the same head.

``HFEncoderPredictor`` is the default predictor with one change: each node's text (question and
path, ``features.node_texts``) is embedded by a frozen encoder (mean-pooled last hidden state) and
the embedding is appended to the dense features; hashed n-grams, prior, calibration and flips are
unchanged. The encoder is loaded with ``local_files_only=True`` from ``config.encoder_path`` on
``config.encoder_device``; nothing is downloaded. Embeddings are cached by text, so a refresh
re-embeds only new nodes; ``save`` stores the head, not the encoder (reloaded from its path on
first use). Registered lazily as ``hf_encoder`` (transformers is imported only here).
"""

from __future__ import annotations

import hashlib

import numpy as np
import polars as pl
import torch

from trace_core.policy.modeldir import check_model_dir
from trace_core.predictor.config import PredictorConfig
from trace_core.predictor.features import FeatureBatch, featurize, node_texts
from trace_core.predictor.hashed import HashedPredictor


class HFEncoderPredictor(HashedPredictor):
    def __init__(self, config: PredictorConfig):
        if not config.encoder_path:
            raise ValueError("hf_encoder needs encoder_path: a local directory with a Hugging Face encoder")
        super().__init__(config)
        self._encoder = None
        self._tokenizer = None
        self._cache: dict[str, np.ndarray] = {}

    def _load(self) -> None:
        from transformers import AutoModel, AutoTokenizer


        device = self.config.encoder_device
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"predictor.encoder_device {device!r}: no CUDA device here (set it to 'cpu')")
        path = str(check_model_dir(self.config.encoder_path))  # safetensors and JSON only
        self._tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self._encoder = (
            AutoModel.from_pretrained(path, local_files_only=True, use_safetensors=True).to(self.config.encoder_device).eval()
        )

    @torch.no_grad()
    def embed(self, texts: list[str], batch: int = 64) -> np.ndarray:
        """``(n, hidden)`` float32 mean-pooled embeddings of ``texts``."""
        if self._encoder is None:
            self._load()
        keys = [hashlib.blake2b(t.encode(), digest_size=12).hexdigest() for t in texts]
        todo = sorted({k: t for k, t in zip(keys, texts, strict=True) if k not in self._cache}.items())
        for s in range(0, len(todo), batch):
            chunk = todo[s : s + batch]
            enc = self._tokenizer([t for _, t in chunk], padding=True, truncation=True,
                                  max_length=self.config.encoder_max_tokens, return_tensors="pt")  # fmt: skip
            enc = {k: v.to(self.config.encoder_device) for k, v in enc.items()}
            hidden = self._encoder(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = ((hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)).float().cpu().numpy()
            for (k, _), v in zip(chunk, pooled, strict=True):
                self._cache[k] = v
        width = self._encoder.config.hidden_size
        return np.stack([self._cache[k] for k in keys]) if keys else np.zeros((0, width), dtype=np.float32)

    def _featurize(self, nodes: pl.DataFrame) -> FeatureBatch:
        fb = featurize(nodes, self.config.features)
        emb = self.embed(node_texts(nodes, self.config.features.max_text_chars)).astype(np.float32)
        return FeatureBatch(fb.idx, fb.vals, fb.offsets, np.concatenate([fb.dense, emb], axis=1))
