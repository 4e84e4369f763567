"""attnbench beside transformers ≥ 5 and its dependency, Hugging Face's ``kernels``: one
process uses a transformers model and attnbench's kernels, from a checkout's root and from
elsewhere.  Skipped where transformers is not installed (CI installs it in two extra
environments, before and after attnbench: ``.ci/run``); the model part needs torch too.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("transformers") is None:
    pytest.skip("transformers is not installed", allow_module_level=True)
try:
    importlib.metadata.distribution("kernels")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("Hugging Face's kernels is not installed", allow_module_level=True)

_SIDE_BY_SIDE = """
import importlib.util, json
import numpy as np
import kernels
from attnbench import kernels as ours
report = {"hf_kernels": kernels.__file__, "has_get_kernel": hasattr(kernels, "get_kernel"),
          "is_ours": kernels is ours}
q = np.random.default_rng(0).standard_normal((1, 2, 16, 8)).astype(np.float32)
expected = ours.attention(q, q, q, causal=True, backend="reference")
report["numba_agrees"] = bool(np.allclose(ours.attention(q, q, q, causal=True), expected,
                                          rtol=1e-5, atol=1e-6))
if importlib.util.find_spec("torch") is not None:
    import torch
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model
    torch.manual_seed(0)
    bert = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=48, vocab_size=100)).eval()
    gpt2 = GPT2Model(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100)).eval()
    ids = torch.randint(0, 100, (1, 12))
    with torch.no_grad():
        report["bert"] = list(bert(ids).last_hidden_state.shape)
        report["gpt2"] = list(gpt2(ids).last_hidden_state.shape)
print(json.dumps(report))
"""


@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
def test_a_transformers_model_and_attnbench_s_kernels_in_one_process(where, tmp_path):
    done = subprocess.run([sys.executable, "-c", _SIDE_BY_SIDE],
                          cwd=ROOT if where == "checkout" else tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["has_get_kernel"] and not report["is_ours"]  # the name is Hugging Face's
    assert ROOT not in Path(report["hf_kernels"]).resolve().parents
    assert report["numba_agrees"]
    if importlib.util.find_spec("torch") is not None:
        assert report["bert"] == [1, 12, 32] and report["gpt2"] == [1, 12, 32]
