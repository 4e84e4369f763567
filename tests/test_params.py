"""Parameter arithmetic (attnbench.studies.params) against published counts and the real arrays."""

import pytest

from attnbench import kernels
from attnbench.studies import params

# name, published total it must equal (exactly) or approach (relative tolerance)
PUBLISHED = [
    # Hugging Face BertModel bert-base-uncased, pooler included
    pytest.param("bert-base", 109_482_240, 0.0, id="bert-base-exact"),
    # Hugging Face GPT2Model gpt2, LM head tied to the token embeddings
    pytest.param("gpt2-small", 124_439_808, 0.0, id="gpt2-small-exact"),
    # Brown et al. 2020: 175.0B
    pytest.param("gpt3-175b", 175.0e9, 0.01, id="gpt3-within-1pct"),
    # Devlin et al. 2019: 340M (rounded)
    pytest.param("bert-large", 340e6, 0.02, id="bert-large-within-2pct"),
    # Touvron et al. 2023: 70B (nominal)
    pytest.param("llama2-70b", 70e9, 0.02, id="llama2-70b-within-2pct"),
]


@pytest.mark.parametrize("name, published, rel", PUBLISHED)
def test_total_matches_published(name, published, rel):
    total = params.count_parameters(params.get_config(name))["total"]
    assert total == pytest.approx(published, rel=rel, abs=0)


def test_bert_base_breakdown():
    row = params.count_parameters(params.get_config("bert-base"))
    assert row["attention_per_layer"] == 2_362_368  # 4 x (768² + 768)
    assert row["attention"] == 28_348_416  # x 12 layers: "28.3M"
    assert row["token_embeddings"] == 30522 * 768
    assert row["position_embeddings"] == 512 * 768 and row["type_embeddings"] == 2 * 768
    assert row["pooler"] == 768 * 768 + 768 and row["lm_head"] == 0
    # 2 LayerNorms per layer + the one after the embeddings, weight and bias each
    assert row["norms"] == (2 * 12 + 1) * 2 * 768
    assert sum(row[g] for g in ("attention", "mlp", "norms", "embeddings", "head")) \
        == row["total"]


def test_gpt3_attention_per_layer_and_share():
    row = params.count_parameters(params.get_config("gpt3-175b"))
    assert row["attention_per_layer"] == 4 * (12288**2 + 12288)
    assert row["d_head"] == 128
    assert row["attention_share_non_embedding"] == pytest.approx(1 / 3, abs=1e-3)


def test_gqa_attention_formula():
    # LLaMA-2-70B: W_Q and W_O 8192², W_K and W_V 8192 x (8 x 128), no biases
    config = params.get_config("llama2-70b")
    assert params.attention_params_per_layer(config) == 2 * 8192**2 + 2 * 8192 * 1024


@pytest.mark.parametrize("name", ["bert-base", "bert-large", "gpt2-small", "tinyllama-1.1b"])
def test_attention_count_matches_multiheadattention(name):
    config = params.get_config(name)
    check = params.cross_check_attention(config)
    assert check["mha_matches"] is True
    layer = kernels.MultiHeadAttention(config.d_model, config.n_heads, config.kv_heads,
                                       bias=config.bias)
    assert check["mha_parameters"] == layer.num_parameters()


def test_too_large_is_counted_from_shapes_only():
    check = params.cross_check_attention(params.get_config("gpt3-175b"))
    assert check["mha_parameters"] is None and "shapes only" in check["mha_check"]


def test_custom_config_and_validation():
    config = params.custom_config(d_model=64, n_layers=2, n_heads=4, d_ff=256, vocab_size=100,
                                  max_len=16)
    row = params.count_parameters(config)
    assert row["attention_per_layer"] == 4 * (64 * 64 + 64)
    assert row["mlp"] == 2 * (2 * 64 * 256 + 256 + 64)
    assert row["embeddings"] == 100 * 64 + 16 * 64
    with pytest.raises(ValueError, match="divisible"):
        params.custom_config(d_model=65, n_layers=1, n_heads=4, d_ff=8, vocab_size=8)
    with pytest.raises(ValueError, match="multiple"):
        params.custom_config(d_model=64, n_layers=1, n_heads=4, n_kv_heads=3, d_ff=8,
                             vocab_size=8)
    with pytest.raises(ValueError, match="unknown configuration"):
        params.get_config("gpt5")


def test_table_and_section():
    table = params.parameter_table(["bert-base", "gpt3-175b"])
    assert list(table["config"]) == ["bert-base", "gpt3-175b"]
    assert table.loc[0, "difference"] == 0
    assert abs(table.loc[1, "difference_pct"]) < 1
    text = params.format_table(table)
    assert "109,482,240" in text and "shapes only" in text
    section = params.section(table)
    assert section.tables and section.figures and section.anchor == "params"
