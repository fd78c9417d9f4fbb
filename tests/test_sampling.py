import pytest
import torch

from course_utils.sampling import AliasTable, inverse_cdf


def test_inverse_cdf_picks_the_first_id_whose_mass_exceeds_u():
    probs = torch.tensor([0.2, 0.0, 0.5, 0.3], dtype=torch.float64)
    cdf = probs.cumsum(0)  # 0.2, 0.2, 0.7, 1.0
    u = torch.tensor([0.0, 0.19, 0.21, 0.69, 0.71, 0.99])
    assert inverse_cdf(cdf, u).tolist() == [0, 0, 2, 2, 3, 3]  # id 1 (probability 0) is never drawn
    assert inverse_cdf(cdf * 7, u).tolist() == [0, 0, 2, 2, 3, 3]  # unnormalised weights give the same ids


def test_batched_rows_equal_one_row_at_a_time():
    gen = torch.Generator().manual_seed(0)
    probs = torch.rand(5, 9, generator=gen, dtype=torch.float64)
    u = torch.rand(5, generator=gen)
    rows = torch.stack([inverse_cdf(p.cumsum(0), u[i:i + 1])[0] for i, p in enumerate(probs)])
    assert torch.equal(inverse_cdf(probs.cumsum(-1), u), rows)


@pytest.mark.parametrize("shape", [(1000,), (50, 20)])
def test_frequencies_follow_the_probabilities(shape):
    probs = torch.tensor([0.1, 0.6, 0.0, 0.3], dtype=torch.float64)
    ids = inverse_cdf(probs.cumsum(0), torch.rand(shape, generator=torch.Generator().manual_seed(1)))
    assert ids.shape == shape
    freq = torch.bincount(ids.flatten(), minlength=4) / ids.numel()
    assert freq[2] == 0 and (freq - probs).abs().max() < 0.05


def test_alias_table_columns_rebuild_the_probabilities():
    probs = torch.tensor([0.1, 0.6, 0.0, 0.3], dtype=torch.float64)
    table = AliasTable(probs * 5)  # unnormalised weights give the same table
    V = len(probs)
    # id i's probability: its own column's kept share plus the shares other columns hand to it
    rebuilt = table.accept / V + torch.zeros(V, dtype=torch.float64).index_add_(0, table.alias, (1 - table.accept) / V)
    assert torch.allclose(rebuilt, probs, atol=1e-12)
    assert table.accept[2] == 0  # id 2 (probability 0) keeps none of its column


def test_alias_draws_follow_the_probabilities():
    probs = torch.tensor([27.0, 8.0, 1.0, 0.0], dtype=torch.float64) / 36
    ids = AliasTable(probs).sample((50_000, 4), torch.Generator().manual_seed(0))
    assert ids.shape == (50_000, 4) and ids.dtype == torch.long
    freq = torch.bincount(ids.flatten(), minlength=4) / ids.numel()
    assert freq[3] == 0 and (freq - probs).abs().max() < 0.005
    with pytest.raises(ValueError, match="non-negative weights"):
        AliasTable(torch.tensor([0.5, -0.1]))
