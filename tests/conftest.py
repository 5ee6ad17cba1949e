import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # the brute-force oracle module


def bayesnet_rows(cards, n, parents=2, net_seed=3, seed=1):
    """``n`` rows sampled from a random Bayesian network over ``cards`` (the tests' shared data)."""
    from fsll_ooc import datasets

    p, _ = datasets.random_bayesnet(cards, parents, seed=net_seed)
    return datasets.sample_table(p, n, seed=seed)
