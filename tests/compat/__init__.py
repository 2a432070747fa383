"""Tests of funcprune.compat, the drop-in torch.nn.utils.prune."""
